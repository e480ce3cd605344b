//! The engine: nodes, the network between them, the virtual clock and the
//! loop that feeds events to the machines.
//!
//! The engine knows nothing about any particular protocol. A [`Node`] wraps
//! one or more sans-IO machines and whatever stands in for the applications
//! above them; the [`World`] delivers it datagrams, timer wake-ups and
//! scripted commands, each with the current virtual time, and carries out the
//! datagrams it sends over the [`Link`]s.

use crate::events::EventQueue;
use crate::link::{Fate, Link, LinkConfig, LinkCounters, LinkId};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rina_core::Instant;
use std::collections::BTreeMap;
use std::fmt::Debug;
use std::net::SocketAddr;

/// Index of a node in its world.
pub type NodeId = usize;

/// Default most events one call of [`World::run_until`] or
/// [`World::run_until_idle`] may process.
pub const DEFAULT_STEP_LIMIT: u64 = 10_000_000;

/// A simulated system: sans-IO machines plus an in-sim application layer.
pub trait Node {
    /// A scripted action (an application asking for something).
    type Command: Debug;
    /// What the node reports for the trace.
    type Event: Debug + Clone + PartialEq;

    /// The fake socket addresses the node receives datagrams on.
    fn addrs(&self) -> Vec<SocketAddr>;
    /// A datagram sent by `from` arrived on the node's address `to`.
    fn on_datagram(
        &mut self,
        ctx: &mut Ctx<'_, Self::Event>,
        to: SocketAddr,
        from: SocketAddr,
        payload: &[u8],
    );
    /// The time returned by [`Node::poll_timeout`] has come.
    fn on_timeout(&mut self, ctx: &mut Ctx<'_, Self::Event>);
    /// A scripted command is due.
    fn on_command(&mut self, ctx: &mut Ctx<'_, Self::Event>, cmd: Self::Command);
    /// When the node next wants [`Node::on_timeout`], if ever.
    fn poll_timeout(&self) -> Option<Instant>;

    /// A datagram the node sent from `from` found its link's queue full at
    /// `now`; the queue has room again at `room_at`. A node that pushes
    /// back (like a sender whose socket buffer is full) keeps it, returns
    /// `None` and sends it again when there is room (its
    /// [`Node::poll_timeout`] should say `room_at`); by default it is given
    /// back and dropped at the tail, as a router would.
    fn on_link_full(
        &mut self,
        now: Instant,
        from: SocketAddr,
        to: SocketAddr,
        payload: Vec<u8>,
        room_at: Instant,
    ) -> Option<Vec<u8>> {
        let _ = (now, from, to, room_at);
        Some(payload)
    }
}

/// What a node may do while handling an event.
pub struct Ctx<'a, E> {
    now: Instant,
    node: NodeId,
    out: &'a mut Vec<(SocketAddr, SocketAddr, Vec<u8>)>,
    events: &'a mut Vec<E>,
}

impl<E> Ctx<'_, E> {
    /// The current virtual time.
    pub fn now(&self) -> Instant {
        self.now
    }

    /// The node being run.
    pub fn node(&self) -> NodeId {
        self.node
    }

    /// Sends `payload` from the node's address `from` to `to`.
    pub fn transmit(&mut self, from: SocketAddr, to: SocketAddr, payload: Vec<u8>) {
        self.out.push((from, to, payload));
    }

    /// Records `event` in the trace, at the current time.
    pub fn record(&mut self, event: E) {
        self.events.push(event);
    }
}

/// What happened to a datagram in the network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetEvent {
    /// Offered to a link.
    Sent,
    /// Reached its destination.
    Delivered,
    /// Lost on the wire.
    Lost,
    /// Dropped at a full queue.
    QueueFull,
    /// Found its queue full and was taken back by the sender (push-back).
    PushedBack,
    /// No link joins the two addresses.
    NoRoute,
    /// Reached an address no node owns.
    NoListener,
}

/// One line of the trace.
#[derive(Debug, Clone, PartialEq)]
pub enum Traced<E> {
    /// Something a node reported.
    Node { node: NodeId, event: E },
    /// A datagram of `len` bytes from `from` to `to`.
    Net {
        what: NetEvent,
        from: SocketAddr,
        to: SocketAddr,
        len: usize,
    },
}

/// A trace line and its time.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceEntry<E> {
    /// When.
    pub at: Instant,
    /// What.
    pub what: Traced<E>,
}

/// Why a run stopped early.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SimError {
    /// The run processed its step limit of events without finishing.
    StepLimit { steps: u64, at: Instant },
}

impl std::fmt::Display for SimError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SimError::StepLimit { steps, at } => write!(
                f,
                "step limit of {steps} events reached at {} ns of virtual time",
                at.as_nanos()
            ),
        }
    }
}

impl std::error::Error for SimError {}

enum Ev<C> {
    Arrive {
        link: LinkId,
        pipe: usize,
        from: SocketAddr,
        to: SocketAddr,
        payload: Vec<u8>,
    },
    Timer {
        node: NodeId,
    },
    Command {
        node: NodeId,
        cmd: C,
    },
}

/// A simulated network of nodes of type `N`, with a virtual clock starting at
/// [`Instant::ZERO`] and randomness drawn from a seed.
pub struct World<N: Node> {
    seed: u64,
    now: Instant,
    queue: EventQueue<Ev<N::Command>>,
    nodes: Vec<N>,
    /// The instant each node's pending timer event is for; a timer event for
    /// any other instant is stale and ignored.
    armed: Vec<Option<Instant>>,
    owners: BTreeMap<SocketAddr, NodeId>,
    links: Vec<Link>,
    routes: BTreeMap<(SocketAddr, SocketAddr), LinkId>,
    trace: Vec<TraceEntry<N::Event>>,
    tracing: bool,
    steps: u64,
    step_limit: u64,
    out: Vec<(SocketAddr, SocketAddr, Vec<u8>)>,
    events: Vec<N::Event>,
    loss_filter: Option<LossFilter>,
}

/// Chooses datagrams to lose on purpose: called with the time, the sending
/// end and the datagram; `true` loses it (counted as lost).
pub type LossFilter = Box<dyn FnMut(Instant, SocketAddr, &[u8]) -> bool>;

impl<N: Node> World<N> {
    /// An empty world whose random draws all derive from `seed`.
    pub fn new(seed: u64) -> Self {
        World {
            seed,
            now: Instant::ZERO,
            queue: EventQueue::new(),
            nodes: Vec::new(),
            armed: Vec::new(),
            owners: BTreeMap::new(),
            links: Vec::new(),
            routes: BTreeMap::new(),
            trace: Vec::new(),
            tracing: true,
            steps: 0,
            step_limit: DEFAULT_STEP_LIMIT,
            out: Vec::new(),
            events: Vec::new(),
            loss_filter: None,
        }
    }

    /// Loses the datagrams `filter` picks (on top of the links' own loss),
    /// to test the loss of one kind of message; `None` removes the filter.
    pub fn set_loss_filter(&mut self, filter: Option<LossFilter>) {
        self.loss_filter = filter;
    }

    /// The seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The current virtual time.
    pub fn now(&self) -> Instant {
        self.now
    }

    /// Events processed since the world was made.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// Sets the most events one run call may process.
    pub fn set_step_limit(&mut self, limit: u64) {
        self.step_limit = limit;
    }

    /// Turns the trace on (the default) or off (for long runs).
    pub fn set_tracing(&mut self, on: bool) {
        self.tracing = on;
    }

    /// Adds a node; its addresses must not be taken.
    ///
    /// # Panics
    /// If one of its addresses belongs to another node (a scenario bug).
    pub fn add_node(&mut self, node: N) -> NodeId {
        let id = self.nodes.len();
        for a in node.addrs() {
            let prev = self.owners.insert(a, id);
            assert!(prev.is_none(), "address {a} is used by two nodes");
        }
        self.nodes.push(node);
        self.armed.push(None);
        self.rearm(id);
        id
    }

    /// A node.
    pub fn node(&self, id: NodeId) -> &N {
        &self.nodes[id]
    }

    /// A node, to change it between runs. Its timer is re-read when the next
    /// event is processed for it, or at once with [`World::rearm`].
    pub fn node_mut(&mut self, id: NodeId) -> &mut N {
        &mut self.nodes[id]
    }

    /// Number of nodes.
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    fn next_rng(&self) -> ChaCha8Rng {
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
        rng.set_stream(self.links.len() as u64);
        rng
    }

    /// Joins addresses `a` and `b` with a full-duplex link.
    pub fn connect(&mut self, a: SocketAddr, b: SocketAddr, cfg: LinkConfig) -> LinkId {
        let id = self.links.len();
        let link = Link::point_to_point(a, b, cfg, self.next_rng());
        self.links.push(link);
        self.routes.insert((a, b), id);
        self.routes.insert((b, a), id);
        id
    }

    /// Joins all of `ends` with one shared medium.
    pub fn connect_shared(&mut self, ends: &[SocketAddr], cfg: LinkConfig) -> LinkId {
        let id = self.links.len();
        let link = Link::shared(ends.to_vec(), cfg, self.next_rng());
        self.links.push(link);
        for &a in ends {
            for &b in ends {
                if a != b {
                    self.routes.insert((a, b), id);
                }
            }
        }
        id
    }

    /// A link.
    pub fn link(&self, id: LinkId) -> &Link {
        &self.links[id]
    }

    /// Changes the loss probability of link `id` from now on (a link that
    /// degrades during a run).
    pub fn set_link_loss(&mut self, id: LinkId, p: f64) {
        self.links[id].set_loss(p);
    }

    /// Counters of what `from` sent on link `id`.
    pub fn link_counters(&self, id: LinkId, from: SocketAddr) -> LinkCounters {
        self.links[id].counters(from)
    }

    /// Schedules `cmd` for node `node` at `at` (not before now).
    pub fn schedule(&mut self, at: Instant, node: NodeId, cmd: N::Command) {
        self.queue.push(at.max(self.now), Ev::Command { node, cmd });
    }

    /// The trace so far.
    pub fn trace(&self) -> &[TraceEntry<N::Event>] {
        &self.trace
    }

    /// The node events of the trace, with their times and nodes.
    pub fn node_events(&self) -> impl Iterator<Item = (Instant, NodeId, &N::Event)> {
        self.trace.iter().filter_map(|e| match &e.what {
            Traced::Node { node, event } => Some((e.at, *node, event)),
            Traced::Net { .. } => None,
        })
    }

    /// A 64-bit FNV-1a digest of the trace's debug form: equal traces give
    /// equal digests on every run and machine.
    pub fn trace_digest(&self) -> u64 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for e in &self.trace {
            for b in format!("{e:?}\n").bytes() {
                h ^= b as u64;
                h = h.wrapping_mul(0x0000_0100_0000_01b3);
            }
        }
        h
    }

    /// Re-reads node `id`'s next timeout and schedules a wake-up for it.
    pub fn rearm(&mut self, id: NodeId) {
        let want = self.nodes[id].poll_timeout().map(|t| t.max(self.now));
        if want != self.armed[id] {
            self.armed[id] = want;
            if let Some(t) = want {
                self.queue.push(t, Ev::Timer { node: id });
            }
        }
    }

    /// Processes every event due at or before `until`, then sets the clock to
    /// `until`. Returns the number of events processed.
    pub fn run_until(&mut self, until: Instant) -> Result<u64, SimError> {
        self.run(Some(until))
    }

    /// Processes events until none is left. Returns the number processed.
    pub fn run_until_idle(&mut self) -> Result<u64, SimError> {
        self.run(None)
    }

    /// Time of the next event that will do something: superseded timer
    /// wake-ups at the head of the queue are discarded.
    fn next_time(&mut self) -> Option<Instant> {
        loop {
            let (at, ev) = self.queue.peek()?;
            match ev {
                Ev::Timer { node } if self.armed[*node] != Some(at) => {
                    self.queue.pop();
                }
                _ => return Some(at),
            }
        }
    }

    /// Processes at most `max` of the events due at or before `until`;
    /// once none due by then is left, sets the clock to `until`. Returns
    /// the number processed and whether the clock has reached `until`. For
    /// a caller that must answer between events (a stop asked for) however
    /// dense they are: it calls again until the clock is there.
    pub fn run_until_at_most(&mut self, until: Instant, max: u64) -> Result<(u64, bool), SimError> {
        self.run_some(Some(until), max)
    }

    fn run(&mut self, until: Option<Instant>) -> Result<u64, SimError> {
        self.run_some(until, u64::MAX).map(|(done, _)| done)
    }

    /// Processes at most `max` events due by `until` (`None`: any);
    /// whether none due is left.
    fn run_some(&mut self, until: Option<Instant>, max: u64) -> Result<(u64, bool), SimError> {
        let mut done = 0;
        while let Some(t) = self.next_time() {
            if until.is_some_and(|u| t > u) {
                break;
            }
            if done == max {
                return Ok((done, false));
            }
            if done >= self.step_limit {
                return Err(SimError::StepLimit {
                    steps: done,
                    at: self.now,
                });
            }
            self.step();
            done += 1;
        }
        if let Some(u) = until {
            self.now = self.now.max(u);
        }
        Ok((done, true))
    }

    /// Processes the next event, if any. Returns whether there was one.
    /// Superseded timer wake-ups are discarded without moving the clock.
    pub fn step(&mut self) -> bool {
        if self.next_time().is_none() {
            return false;
        }
        let Some((at, ev)) = self.queue.pop() else {
            return false;
        };
        self.now = at;
        self.steps += 1;
        let node = match ev {
            Ev::Arrive {
                link,
                pipe,
                from,
                to,
                payload,
            } => {
                self.links[link].arrived(pipe, payload.len());
                self.net(NetEvent::Delivered, from, to, payload.len());
                let Some(&id) = self.owners.get(&to) else {
                    self.net(NetEvent::NoListener, from, to, payload.len());
                    return true;
                };
                let mut ctx = Ctx {
                    now: at,
                    node: id,
                    out: &mut self.out,
                    events: &mut self.events,
                };
                self.nodes[id].on_datagram(&mut ctx, to, from, &payload);
                id
            }
            Ev::Timer { node } => {
                self.armed[node] = None;
                let mut ctx = Ctx {
                    now: at,
                    node,
                    out: &mut self.out,
                    events: &mut self.events,
                };
                self.nodes[node].on_timeout(&mut ctx);
                node
            }
            Ev::Command { node, cmd } => {
                let mut ctx = Ctx {
                    now: at,
                    node,
                    out: &mut self.out,
                    events: &mut self.events,
                };
                self.nodes[node].on_command(&mut ctx, cmd);
                node
            }
        };
        self.flush(node);
        self.rearm(node);
        true
    }

    fn net(&mut self, what: NetEvent, from: SocketAddr, to: SocketAddr, len: usize) {
        if self.tracing {
            self.trace.push(TraceEntry {
                at: self.now,
                what: Traced::Net {
                    what,
                    from,
                    to,
                    len,
                },
            });
        }
    }

    /// Records the node's events and hands its datagrams to the links.
    fn flush(&mut self, node: NodeId) {
        for event in std::mem::take(&mut self.events) {
            if self.tracing {
                self.trace.push(TraceEntry {
                    at: self.now,
                    what: Traced::Node { node, event },
                });
            }
        }
        for (from, to, payload) in std::mem::take(&mut self.out) {
            let len = payload.len();
            let Some(&link) = self.routes.get(&(from, to)) else {
                self.net(NetEvent::NoRoute, from, to, len);
                continue;
            };
            let payload = match self.links[link].full_until(self.now, from) {
                Some(room_at) => {
                    match self.nodes[node].on_link_full(self.now, from, to, payload, room_at) {
                        Some(p) => p,
                        None => {
                            self.net(NetEvent::PushedBack, from, to, len);
                            continue;
                        }
                    }
                }
                None => payload,
            };
            self.net(NetEvent::Sent, from, to, len);
            let now = self.now;
            if self
                .loss_filter
                .as_mut()
                .is_some_and(|f| f(now, from, &payload))
            {
                self.net(NetEvent::Lost, from, to, len);
                continue;
            }
            match self.links[link].transmit(self.now, from, len) {
                Some(Fate::Arrives { at, pipe }) => self.queue.push(
                    at,
                    Ev::Arrive {
                        link,
                        pipe,
                        from,
                        to,
                        payload,
                    },
                ),
                Some(Fate::Lost) => self.net(NetEvent::Lost, from, to, len),
                Some(Fate::QueueFull) => self.net(NetEvent::QueueFull, from, to, len),
                None => self.net(NetEvent::NoRoute, from, to, len),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A node that wants a timeout every microsecond, and counts them.
    struct Ticker {
        next: Instant,
        ticks: u64,
    }

    impl Node for Ticker {
        type Command = ();
        type Event = ();
        fn addrs(&self) -> Vec<SocketAddr> {
            Vec::new()
        }
        fn on_datagram(&mut self, _: &mut Ctx<'_, ()>, _: SocketAddr, _: SocketAddr, _: &[u8]) {}
        fn on_timeout(&mut self, ctx: &mut Ctx<'_, ()>) {
            self.ticks += 1;
            self.next = ctx.now() + Duration::from_micros(1);
        }
        fn on_command(&mut self, _: &mut Ctx<'_, ()>, _: ()) {}
        fn poll_timeout(&self) -> Option<Instant> {
            Some(self.next)
        }
    }

    #[test]
    fn run_until_at_most_stops_after_max_events_and_resumes_where_it_stopped() {
        let mut w = World::new(1);
        let id = w.add_node(Ticker {
            next: Instant::from_nanos(1_000),
            ticks: 0,
        });
        w.rearm(id);
        let until = Instant::from_nanos(10_000_000); // 10 000 ticks due
        let (done, reached) = w.run_until_at_most(until, 4_000).unwrap();
        assert_eq!((done, reached, w.node(id).ticks), (4_000, false, 4_000));
        // The clock is at the last event run, not at `until`.
        assert_eq!(w.now(), Instant::from_nanos(4_000_000));
        assert_eq!(w.run_until_at_most(until, 4_000).unwrap(), (4_000, false));
        assert_eq!(w.run_until_at_most(until, 4_000).unwrap(), (2_000, true));
        assert_eq!((w.now(), w.node(id).ticks), (until, 10_000));
        // The same as one run_until.
        let mut one = World::new(1);
        let id = one.add_node(Ticker {
            next: Instant::from_nanos(1_000),
            ticks: 0,
        });
        one.rearm(id);
        assert_eq!(one.run_until(until).unwrap(), 10_000);
        assert_eq!(one.node(id).ticks, 10_000);
    }
}
