//! Helpers that make a scenario read like its description: fake addresses,
//! names, times, a two-node set-up, and scripted allocations and streams.

use crate::link::{LinkConfig, LinkId};
use crate::shim_node::{App, Command, Delivery, ShimNode};
use crate::world::{NodeId, World};
use rina_core::shim_udp::{Config, PortId};
use rina_core::Instant;
use rina_wire::{AppName, QosSpec};
use std::net::SocketAddr;
use std::time::Duration;

/// The fake address of simulated system `n`: `10.0.0.n:7000`. It exists only
/// inside the simulator.
pub fn addr(n: u8) -> SocketAddr {
    SocketAddr::from(([10, 0, 0, n], 7000))
}

/// An application name from a string.
///
/// # Panics
/// If `s` is not a valid name (a scenario bug).
pub fn name(s: &str) -> AppName {
    s.parse()
        .unwrap_or_else(|e| panic!("bad application name {s:?}: {e}"))
}

/// `n` milliseconds after the epoch.
pub fn millis(n: u64) -> Instant {
    Instant::from_nanos(n * 1_000_000)
}

/// `n` microseconds after the epoch.
pub fn micros(n: u64) -> Instant {
    Instant::from_nanos(n * 1_000)
}

impl World<ShimNode> {
    /// Schedules node `node`'s application `local` to allocate a flow to
    /// `remote` at `at`, with best-effort QoS. Returns the port-id the flow
    /// will have on `node`.
    pub fn allocate(&mut self, at: Instant, node: NodeId, local: &str, remote: &str) -> PortId {
        let port = self.node_mut(node).reserve_port();
        self.schedule(
            at,
            node,
            Command::Allocate {
                port,
                local: name(local),
                remote: name(remote),
                qos: QosSpec::default(),
            },
        );
        port
    }

    /// Schedules `count` SDUs of `len` bytes on `port` of `node`, the first
    /// at `start` and then one every `interval`; SDU `i` is tagged `i`.
    pub fn send_stream(
        &mut self,
        node: NodeId,
        port: PortId,
        start: Instant,
        count: u64,
        len: usize,
        interval: Duration,
    ) {
        for i in 0..count {
            let at = start + interval * u32::try_from(i).unwrap_or(u32::MAX);
            self.schedule(at, node, Command::Write { port, len, tag: i });
        }
    }

    /// SDUs delivered on `port` of `node`.
    pub fn delivered(&self, node: NodeId, port: PortId) -> &[Delivery] {
        self.node(node)
            .flow(port)
            .map_or(&[][..], |f| f.delivered.as_slice())
    }
}

/// Two shim nodes, A at [`addr`]`(1)` and B at [`addr`]`(2)`, in DIF `"udp"`,
/// joined by one link.
pub struct Pair {
    /// The world.
    pub world: World<ShimNode>,
    /// Node A.
    pub a: NodeId,
    /// Node B.
    pub b: NodeId,
    /// The link between them.
    pub link: LinkId,
}

impl Pair {
    /// A and B joined by `link`; A's directory places each of `at_b` at B
    /// (whether or not B registers it), B's directory is empty.
    pub fn new(seed: u64, link: LinkConfig, at_b: &[&str]) -> Pair {
        Self::with_config(seed, link, at_b, |_| {})
    }

    /// Like [`Pair::new`], with `tweak` applied to both shims' configurations.
    /// The shims' liveness check (`keepalive`) is off unless `tweak` turns
    /// it on: a pair's world runs until idle, which a periodic check would
    /// never let it be while a flow is up.
    pub fn with_config(
        seed: u64,
        link: LinkConfig,
        at_b: &[&str],
        tweak: impl Fn(&mut Config),
    ) -> Pair {
        let mut world = World::new(seed);
        let mut ca = Config::new("udp");
        ca.keepalive = None;
        for n in at_b {
            ca.directory.insert(name(n), addr(2));
        }
        tweak(&mut ca);
        let mut cb = Config::new("udp");
        cb.keepalive = None;
        tweak(&mut cb);
        let a = world.add_node(ShimNode::new(addr(1), ca));
        let b = world.add_node(ShimNode::new(addr(2), cb));
        let link = world.connect(addr(1), addr(2), link);
        Pair { world, a, b, link }
    }

    /// Registers `n` on B with `app`.
    ///
    /// # Panics
    /// If the name is taken (a scenario bug).
    pub fn register_on_b(&mut self, n: &str, app: App) -> &mut Self {
        self.world
            .node_mut(self.b)
            .register(name(n), app)
            .unwrap_or_else(|e| panic!("{e}"));
        self
    }
}
