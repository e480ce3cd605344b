//! A deterministic discrete-event simulator for the RINA stack.
//!
//! The protocol machines of `rina-core` are sans-IO: they are fed events with
//! the current time and answer with actions. This crate feeds them from a
//! virtual clock instead of sockets and a wall clock, so whole networks of
//! *unchanged* machines run over emulated links — with rate, propagation
//! delay, jitter, random loss and bounded queues — deterministically and in
//! milliseconds. The same seed always gives the same run, event for event.
//!
//! Nothing here reads the wall clock, opens a socket or touches a global
//! random source: time is [`rina_core::Instant`] counted from zero, and every
//! random draw comes from a ChaCha8 stream seeded from the world's `u64` seed
//! (one stream per link).
//!
//! # Pieces
//!
//! * [`events`] — the event queue, ordered by (time, insertion order).
//! * [`link`] — emulated links and their counters.
//! * [`world`] — the engine: the [`Node`] trait any simulated system
//!   implements, and the [`World`] that runs nodes and links.
//! * [`shim_node`] — [`ShimNode`]: one [`rina_core::shim_udp::ShimUdp`] plus an
//!   in-sim application layer (registered names with an accept / refuse /
//!   ignore policy, optional echo, a log of every flow and delivered SDU).
//! * [`normal_node`] — [`NormalNode`]: one [`rina_core::normal::NormalIpcp`]
//!   whose N-1 ports are link ends, with scripted streams, echo, slow readers.
//! * [`chain`] — a chain of normal IPCPs with static routes.
//! * [`scenario`] — helpers: fake addresses, names, times, a two-node set-up,
//!   scripted allocations and SDU streams.
//!
//! # How the world runs
//!
//! Three kinds of event wait in the queue: a datagram arriving at an address,
//! a node's timer (the time its machine returned from `poll_timeout`), and a
//! scripted command (an application asking for something). The loop pops the
//! earliest, sets the clock to its time, hands it to the node, carries out
//! what the node sends (each datagram goes through its link's queue, rate,
//! loss and delay and becomes an arrival event, or a drop), records what the
//! node reports in the trace, and re-arms the node's timer.
//! [`World::run_until`] stops at a given time; [`World::run_until_idle`] when
//! nothing is left. Both give up with [`SimError::StepLimit`] after a bounded
//! number of events, so a scenario can never loop forever.
//!
//! New kinds of system (a normal IPCP stacked on shims, later) are new
//! [`Node`] implementations; the engine and links do not change.
//!
//! # Writing a scenario
//!
//! Two systems joined by a 10 Mb/s link with 10 ms of delay and 1 % loss;
//! B registers `echo`, A allocates a flow to it at t = 0 and then writes 100
//! SDUs of 1000 bytes, one every 2 ms:
//!
//! ```
//! use rina_sim::scenario::{millis, Pair};
//! use rina_sim::{App, LinkConfig};
//! use std::time::Duration;
//!
//! let link = LinkConfig::new(10_000_000, Duration::from_millis(10)).loss(0.01);
//! let mut p = Pair::new(42, link, &["echo"]);
//! p.register_on_b("echo", App::sink());
//! let port = p.world.allocate(millis(0), p.a, "perf", "echo");
//! p.world.run_until(millis(100)).unwrap();
//! assert!(p.world.node(p.a).flow(port).unwrap().allocated_at.is_some());
//!
//! p.world.send_stream(p.a, port, millis(100), 100, 1000, Duration::from_millis(2));
//! p.world.run_until_idle().unwrap();
//!
//! // B's end of the flow is the one it accepted. Every datagram A sent
//! // (requests and data) was either delivered or lost on the way.
//! let (_, flow_b) = p.world.node(p.b).flows().iter().next().unwrap();
//! let from_a = p.world.link_counters(p.link, p.world.node(p.a).addr());
//! assert_eq!(from_a.sent, from_a.delivered + from_a.dropped_loss);
//! assert!(flow_b.delivered.len() > 90);
//! // Same seed, same run: this figure never changes.
//! println!("{} of 100 SDUs delivered", flow_b.delivered.len());
//! ```

pub mod backlog;
pub mod chain;
pub mod events;
pub mod link;
pub mod normal_node;
pub mod qos_port;
pub mod scenario;
pub mod shim_node;
pub mod world;

pub use link::{LinkConfig, LinkCounters, LinkId};
pub use normal_node::{NormalCommand, NormalEvent, NormalNode};
pub use shim_node::{App, Command, Delivery, FlowLog, Policy, ShimEvent, ShimNode};
pub use world::{NetEvent, Node, NodeId, SimError, TraceEntry, Traced, World};
