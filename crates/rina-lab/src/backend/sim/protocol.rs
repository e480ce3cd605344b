//! The protocol engine: one unchanged `rina-core` normal IPCP per member of
//! the experiment's one normal DIF, on `rina-sim`'s world and emulated
//! links. Members enroll through the bootstrap member (hellos, password,
//! address grant), run link-state routing and the disseminated directory,
//! and the flows are allocated by name and carried by EFCP. Applications
//! are in-sim: echo servers write every SDU back, sinks time-stamp what
//! arrives; clients follow tgen schedules or send echo probes. See the
//! module doc of [`super`].

use super::{mix, LINK_OVERHEAD};
use crate::backend::RunCtx;
use crate::model::{AppRole, TrafficKind};
use crate::resolve::{Dest, EventKind, Experiment, Over};
use crate::results::{stats_ms, FlowRecord, LinkRecord, Reservoir, RunOutput, TimelineEntry};
use crate::LabError;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rina_core::efcp::EfcpConfig;
use rina_core::normal::{
    cubes::QosCube, Action, FlowId, MembershipConfig, N1Port, NormalConfig, NormalIpcp,
};
use rina_core::rmt::{Address, CuMap, SchedulerConfig};
use rina_core::sdup::SdupConfig;
use rina_core::{directory, routing, Instant};
use rina_sim::world::Ctx;
use rina_sim::{LinkConfig, Node, World};
use rina_tools::tgen::gen::{Generator, Packet as GenPacket};
use rina_wire::{AppName, QosSpec};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

/// Header of every SDU the in-sim applications write: sequence number,
/// send time (ns of virtual time), flow index, attempt.
const HDR: usize = 20;
/// Longest warm-up (enrollment, routing, directory) before giving up.
const WARMUP_LIMIT: Duration = Duration::from_secs(120);
/// Wait before a client allocates again after its flow failed.
const RETRY: Duration = Duration::from_millis(250);
/// Virtual time after the traffic during which SDUs still arrive.
const DRAIN: Duration = Duration::from_secs(2);
/// Step of the driving loop (progress, stop flag).
const STEP: Duration = Duration::from_millis(50);

/// Whether the protocol engine can run `exp`, or why not.
pub(super) fn eligible(exp: &Experiment) -> Result<(), String> {
    if exp.difs.len() != 1 {
        return Err(format!("{} normal DIFs", exp.difs.len()));
    }
    let d = &exp.difs[0];
    if d.adjacencies
        .iter()
        .any(|a| !matches!(a.over, Over::Link(_)))
    {
        return Err("a DIF over another DIF".into());
    }
    if !matches!(d.scheduler, SchedulerConfig::Fifo(_)) {
        // rina-sim's links take every frame the RMT hands them, so a QoS
        // policy would never hold anything: QoS is the queueing engine's.
        return Err(format!("the {} scheduling policy", d.scheduler.name()));
    }
    if exp.flows.iter().any(|f| f.shim.is_some()) {
        return Err("flows directly over link shims".into());
    }
    if exp.flows.iter().any(|f| f.kind == TrafficKind::Perf) {
        return Err("perf traffic".into());
    }
    if exp
        .events
        .iter()
        .any(|e| matches!(e.what, EventKind::NodeStop(_) | EventKind::NodeStart(_)))
    {
        return Err("node stop/start events".into());
    }
    if exp.links.len() > 60_000 || exp.flows.len() > 60_000 {
        return Err("more than 60 000 links or flows".into());
    }
    // tgen at high rates through the full stack is the queueing engine's job.
    let offered: f64 = exp
        .flows
        .iter()
        .filter_map(|f| f.profile.as_ref())
        .map(|p| p.mean_rate_bps())
        .sum();
    if offered > 50e6 {
        return Err(format!("{:.0} Mb/s of tgen traffic", offered / 1e6));
    }
    Ok(())
}

fn end_addr(link: usize, side: u8) -> SocketAddr {
    let l = link as u16;
    SocketAddr::new(
        IpAddr::V4(Ipv4Addr::new(10, (l >> 8) as u8, l as u8, side + 1)),
        7000,
    )
}

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ClientState {
    Allocating,
    Open,
    Done,
}

#[derive(Debug)]
struct Client {
    flow: usize,
    attempt: u16,
    kind: TrafficKind,
    state: ClientState,
    requested_at: u64,
    failed_at: Option<u64>,
    allocated_at: Option<u64>,
    remote_addr: Option<Address>,
    /// Next SDU due (ns), tgen or echo.
    next_at: Option<u64>,
    gen: Option<Generator>,
    pending: Option<GenPacket>,
    base: u64,
    stop: u64,
    interval: u64,
    size: usize,
    seq: u64,
    sent: u64,
    sent_bytes: u64,
    rtts: Vec<f64>,
    error: Option<String>,
}

#[derive(Debug, Default)]
struct Rx {
    received: u64,
    bytes: u64,
    delays: Vec<f64>,
}

/// Commands the engine gives a node.
#[derive(Debug)]
enum Cmd {
    Allocate { flow: usize },
    Register { name: AppName, echo: bool },
    Unregister { name: AppName },
    PortDown(N1Port),
    PortUp(N1Port),
}

/// A simulated system: one normal IPCP and the in-sim applications.
#[derive(Debug)]
struct LabNode {
    ipcp: NormalIpcp,
    ports: BTreeMap<N1Port, (SocketAddr, SocketAddr)>,
    down: BTreeMap<N1Port, (SocketAddr, SocketAddr)>,
    by_addr: HashMap<SocketAddr, N1Port>,
    names: BTreeMap<AppName, bool>,
    next_accept: FlowId,
    /// Accepted flows: name they were accepted for, echo.
    accepted: BTreeMap<FlowId, (AppName, bool)>,
    clients: BTreeMap<FlowId, Client>,
    /// Client of each experiment flow here: latest flow id and the
    /// retry time if it must allocate again.
    latest: BTreeMap<usize, (FlowId, Option<u64>)>,
    rx: BTreeMap<(usize, u16), Rx>,
    /// Set up by the engine: flows this node is the client of.
    specs: BTreeMap<usize, ClientSpec>,
}

#[derive(Debug, Clone)]
struct ClientSpec {
    kind: TrafficKind,
    remote: AppName,
    qos: QosSpec,
    profile: Option<rina_tools::tgen::gen::Profile>,
    seed: u64,
    phase: u64,
    interval: u64,
    size: usize,
    stop: u64,
}

impl LabNode {
    fn new(ipcp: NormalIpcp) -> Self {
        LabNode {
            ipcp,
            ports: BTreeMap::new(),
            down: BTreeMap::new(),
            by_addr: HashMap::new(),
            names: BTreeMap::new(),
            next_accept: 1_000_000,
            accepted: BTreeMap::new(),
            clients: BTreeMap::new(),
            latest: BTreeMap::new(),
            rx: BTreeMap::new(),
            specs: BTreeMap::new(),
        }
    }

    fn attach(&mut self, port: N1Port, local: SocketAddr, peer: SocketAddr) {
        self.ports.insert(port, (local, peer));
        self.by_addr.insert(local, port);
        self.ipcp.add_port(port);
    }

    fn allocate(&mut self, now: u64, flow: usize) {
        let Some(spec) = self.specs.get(&flow).cloned() else {
            return;
        };
        if now >= spec.stop {
            self.latest.entry(flow).or_insert((0, None)).1 = None;
            return;
        }
        let attempt = self
            .latest
            .get(&flow)
            .and_then(|(fid, _)| self.clients.get(fid))
            .map_or(1, |c| c.attempt + 1);
        let fid = (flow as FlowId + 1) * 1000 + FlowId::from(attempt);
        let local: AppName = format!("client-{flow}")
            .parse()
            .unwrap_or_else(|_| spec.remote.clone());
        let mut c = Client {
            flow,
            attempt,
            kind: spec.kind,
            state: ClientState::Allocating,
            requested_at: now,
            failed_at: None,
            allocated_at: None,
            remote_addr: None,
            next_at: None,
            gen: None,
            pending: None,
            base: 0,
            stop: spec.stop,
            interval: spec.interval,
            size: spec.size.max(HDR),
            seq: 0,
            sent: 0,
            sent_bytes: 0,
            rtts: Vec::new(),
            error: None,
        };
        if let Some(p) = &spec.profile {
            let mut g = Generator::new(p.clone(), spec.seed);
            c.pending = g.next();
            c.gen = Some(g);
        }
        let t = Instant::from_nanos(now);
        let res = self
            .ipcp
            .allocate(t, fid, local, spec.remote.clone(), spec.qos);
        self.latest.insert(flow, (fid, None));
        if let Err(e) = res {
            c.state = ClientState::Done;
            c.failed_at = Some(now);
            c.error = Some(e.to_string());
            self.latest.insert(flow, (fid, Some(now + ns(RETRY))));
        }
        self.clients.insert(fid, c);
    }

    fn open(&mut self, now: u64, fid: FlowId) {
        let remote = self
            .ipcp
            .flows()
            .find(|(f, _)| *f == fid)
            .map(|(_, ep)| ep.remote_addr);
        let phase = self
            .clients
            .get(&fid)
            .and_then(|c| self.specs.get(&c.flow))
            .map_or(0, |s| s.phase);
        let Some(c) = self.clients.get_mut(&fid) else {
            return;
        };
        c.state = ClientState::Open;
        c.allocated_at = Some(now);
        c.remote_addr = remote;
        c.base = now + phase;
        c.next_at = match c.kind {
            TrafficKind::Tgen => c.pending.map(|p| c.base + p.at_ns),
            _ => Some(now),
        };
    }

    fn failed(&mut self, now: u64, fid: FlowId, why: String) {
        let Some(c) = self.clients.get_mut(&fid) else {
            return;
        };
        if c.state == ClientState::Done {
            return;
        }
        c.state = ClientState::Done;
        c.next_at = None;
        c.failed_at = Some(now);
        if c.error.is_none() && c.allocated_at.is_none() {
            c.error = Some(why);
        }
        let flow = c.flow;
        if self.latest.get(&flow).map(|x| x.0) == Some(fid) {
            self.latest.insert(flow, (fid, Some(now + ns(RETRY))));
        }
    }

    /// Writes what the clients have due.
    fn run_clients(&mut self, now: u64) {
        let t = Instant::from_nanos(now);
        let due: Vec<FlowId> = self
            .clients
            .iter()
            .filter(|(_, c)| c.state == ClientState::Open && c.next_at.is_some_and(|x| x <= now))
            .map(|(f, _)| *f)
            .collect();
        for fid in due {
            while let Some(c) = self.clients.get_mut(&fid) {
                let Some(at) = c.next_at else { break };
                if at > now || c.state != ClientState::Open {
                    break;
                }
                if at >= c.stop {
                    c.next_at = None;
                    break;
                }
                let size = match c.kind {
                    TrafficKind::Tgen => {
                        let size = c.pending.map_or(HDR, |p| p.size).max(HDR);
                        c.pending = c.gen.as_mut().and_then(|g| g.next());
                        c.next_at = c.pending.map(|p| c.base + p.at_ns);
                        size
                    }
                    _ => {
                        c.next_at = Some(at + c.interval.max(1));
                        c.size
                    }
                };
                let mut sdu = vec![0u8; size];
                sdu[..8].copy_from_slice(&c.seq.to_be_bytes());
                sdu[8..16].copy_from_slice(&now.to_be_bytes());
                sdu[16..18].copy_from_slice(&(c.flow as u16).to_be_bytes());
                sdu[18..20].copy_from_slice(&c.attempt.to_be_bytes());
                c.seq += 1;
                c.sent += 1;
                c.sent_bytes += size as u64;
                let _ = self.ipcp.write(t, fid, &sdu);
            }
        }
    }

    fn pump(&mut self, ctx: &mut Ctx<'_, ()>) {
        let now = ctx.now().as_nanos();
        self.run_clients(now);
        while let Some(a) = self.ipcp.poll_action() {
            self.on_action(ctx, a);
        }
    }

    fn on_action(&mut self, ctx: &mut Ctx<'_, ()>, a: Action) {
        let now = ctx.now();
        let t = now.as_nanos();
        match a {
            Action::Transmit { port, frame } => {
                if let Some(&(local, peer)) = self.ports.get(&port) {
                    ctx.transmit(local, peer, frame);
                }
            }
            Action::Deliver { flow, sdu } => {
                if sdu.len() < HDR {
                    return;
                }
                let mut b8 = [0u8; 8];
                b8.copy_from_slice(&sdu[8..16]);
                let sent = u64::from_be_bytes(b8);
                let f = u16::from_be_bytes([sdu[16], sdu[17]]) as usize;
                let att = u16::from_be_bytes([sdu[18], sdu[19]]);
                let delay_ms = t.saturating_sub(sent) as f64 / 1e6;
                if let Some(c) = self.clients.get_mut(&flow) {
                    // An echo reply.
                    c.rtts.push(delay_ms);
                } else if let Some((_, echo)) = self.accepted.get(&flow) {
                    // Counted as data (tgen) whatever the server does with
                    // it; an echo server also writes it back (echo probes
                    // are measured by the client).
                    if *echo {
                        let _ = self.ipcp.write(now, flow, &sdu);
                    }
                    let r = self.rx.entry((f, att)).or_default();
                    r.received += 1;
                    r.bytes += sdu.len() as u64;
                    r.delays.push(delay_ms);
                }
            }
            Action::Management { .. } | Action::Membership(_) => {}
            Action::FlowFailed { flow, error } => {
                self.failed(t, flow, format!("{error:?}"));
            }
            Action::FlowRequest {
                handle,
                local,
                remote: _,
                ..
            } => match self.names.get(&local).copied() {
                Some(echo) => {
                    let fid = self.next_accept;
                    self.next_accept += 1;
                    if self.ipcp.accept(now, handle, fid).is_ok() {
                        self.accepted.insert(fid, (local, echo));
                    }
                }
                None => {
                    let _ = self.ipcp.refuse(handle, "not registered here");
                }
            },
            Action::RequestWithdrawn { .. } => {}
            Action::Allocated { flow, .. } => self.open(t, flow),
            Action::AllocateFailed { flow, error } => self.failed(t, flow, error.to_string()),
            Action::Deallocated { flow } => {
                self.accepted.remove(&flow);
                self.failed(t, flow, "deallocated by the peer".into());
            }
        }
    }
}

impl Node for LabNode {
    type Command = Cmd;
    type Event = ();

    fn addrs(&self) -> Vec<SocketAddr> {
        let mut v: Vec<SocketAddr> = self.by_addr.keys().copied().collect();
        v.extend(self.down.values().map(|x| x.0));
        v
    }

    fn on_datagram(
        &mut self,
        ctx: &mut Ctx<'_, ()>,
        to: SocketAddr,
        _from: SocketAddr,
        payload: &[u8],
    ) {
        if let Some(&port) = self.by_addr.get(&to) {
            self.ipcp.on_frame(ctx.now(), port, payload);
        }
        self.pump(ctx);
    }

    fn on_timeout(&mut self, ctx: &mut Ctx<'_, ()>) {
        let now = ctx.now();
        self.ipcp.handle_timeout(now);
        let due: Vec<usize> = self
            .latest
            .iter()
            .filter(|(_, (_, r))| r.is_some_and(|r| r <= now.as_nanos()))
            .map(|(f, _)| *f)
            .collect();
        for f in due {
            self.allocate(now.as_nanos(), f);
        }
        self.pump(ctx);
    }

    fn on_command(&mut self, ctx: &mut Ctx<'_, ()>, cmd: Cmd) {
        let now = ctx.now();
        match cmd {
            Cmd::Allocate { flow } => self.allocate(now.as_nanos(), flow),
            Cmd::Register { name, echo } => {
                if self.ipcp.register(name.clone()).is_ok() {
                    self.names.insert(name, echo);
                }
            }
            Cmd::Unregister { name } => {
                self.names.remove(&name);
                self.ipcp.unregister(&name);
                // The server process goes: its flows are deallocated.
                let gone: Vec<FlowId> = self
                    .accepted
                    .iter()
                    .filter(|(_, (n, _))| *n == name)
                    .map(|(f, _)| *f)
                    .collect();
                for f in gone {
                    let _ = self.ipcp.deallocate(now, f);
                    self.accepted.remove(&f);
                }
            }
            Cmd::PortDown(port) => {
                self.ipcp.neighbor_down(now, port);
                self.ipcp.remove_port(port);
                if let Some((local, peer)) = self.ports.remove(&port) {
                    self.by_addr.remove(&local);
                    self.down.insert(port, (local, peer));
                }
            }
            Cmd::PortUp(port) => {
                if let Some((local, peer)) = self.down.remove(&port) {
                    self.attach(port, local, peer);
                }
            }
        }
        self.pump(ctx);
    }

    fn poll_timeout(&self) -> Option<Instant> {
        let clients = self
            .clients
            .values()
            .filter(|c| c.state == ClientState::Open)
            .filter_map(|c| c.next_at);
        let retries = self.latest.values().filter_map(|(_, r)| *r);
        self.ipcp
            .poll_timeout()
            .into_iter()
            .chain(clients.chain(retries).map(Instant::from_nanos))
            .min()
    }
}

fn cubes(exp: &Experiment) -> Vec<QosCube> {
    exp.difs[0]
        .cubes
        .iter()
        .map(|c| {
            let efcp = if c.reliable {
                EfcpConfig::reliable()
            } else {
                EfcpConfig::unreliable()
            };
            QosCube::new(c.id, c.name.clone(), efcp).with_cell(c.urgency, c.cherish)
        })
        .collect()
}

/// Runs `exp` on the protocol machines.
pub(super) fn run(
    exp: &Experiment,
    ctx: &RunCtx<'_>,
    out: &mut RunOutput,
) -> Result<u64, LabError> {
    let d = &exp.difs[0];
    let err = |what: String| LabError::Backend {
        backend: "sim",
        what,
    };
    let mut world: World<LabNode> = World::new(exp.seed);
    world.set_tracing(false);
    world.set_step_limit(u64::MAX);
    let mut cu = CuMap::new();
    for c in &d.cubes {
        cu = cu.with(c.id, c.urgency, c.cherish);
    }
    // One IPCP per member; node index -> world id.
    let mut id_of: BTreeMap<usize, usize> = BTreeMap::new();
    for &m in &d.members {
        let boot = m == d.bootstrap;
        let mut c = NormalConfig::new(d.name.clone(), if boot { 1 } else { 0 });
        c.dt.max_pdu_size = d.max_pdu.unwrap_or(1470);
        c.sdup = SdupConfig {
            ttl: Some(64),
            crc: true,
        };
        c.cubes = cubes(exp);
        if boot {
            c.routing = Some(routing::Config::default());
            c.dynamic_directory = Some(directory::Config::default());
        }
        let mut mc = MembershipConfig::new(
            format!("ipcp-{}", exp.nodes[m])
                .parse()
                .map_err(|e| err(format!("node name: {e:?}")))?,
        );
        mc.password = d.password.clone();
        c.membership = Some(mc);
        let sched = d.scheduler.build(&cu).map_err(|e| err(e.to_string()))?;
        let ipcp = NormalIpcp::new(c, sched).map_err(|e| err(format!("{e}")))?;
        let mut node = LabNode::new(ipcp);
        for a in &d.adjacencies {
            if let Over::Link(l) = a.over {
                let link = &exp.links[l];
                let port = l as N1Port + 1;
                if link.a == m {
                    node.attach(port, end_addr(l, 0), end_addr(l, 1));
                } else if link.b == m {
                    node.attach(port, end_addr(l, 1), end_addr(l, 0));
                }
            }
        }
        id_of.insert(m, world.add_node(node));
    }
    let mut wlinks: BTreeMap<usize, usize> = BTreeMap::new();
    for a in &d.adjacencies {
        if let Over::Link(l) = a.over {
            let link = &exp.links[l];
            let cfg = LinkConfig {
                rate_bps: Some(link.rate_bps as u64),
                delay: link.delay,
                jitter: Duration::ZERO,
                loss: link.loss,
                queue_packets: link.queue,
                overhead_bytes: LINK_OVERHEAD as u32,
            };
            wlinks.insert(l, world.connect(end_addr(l, 0), end_addr(l, 1), cfg));
        }
    }
    fn node<'w>(w: &'w World<LabNode>, ids: &BTreeMap<usize, usize>, n: usize) -> &'w LabNode {
        w.node(ids[&n])
    }

    // Warm-up 1: every member enrolls.
    let limit = ns(WARMUP_LIMIT);
    let step = |w: &mut World<LabNode>| -> Result<(), LabError> {
        if ctx.stopped() {
            return Err(LabError::Interrupted);
        }
        let t = w.now() + Duration::from_millis(100);
        w.run_until(t).map(|_| ()).map_err(|e| err(e.to_string()))
    };
    while !d
        .members
        .iter()
        .all(|&m| node(&world, &id_of, m).ipcp.is_enrolled())
    {
        if world.now().as_nanos() > limit {
            return Err(err("members did not all enroll in 120 s".into()));
        }
        step(&mut world)?;
        (ctx.progress)(0.0, "enrolling");
    }
    let enrolled = world.now().as_nanos();
    // Applications: the registered ones, and a sink per destination node.
    let app_name = |a: usize| -> Result<AppName, LabError> {
        exp.apps[a]
            .name
            .parse()
            .map_err(|e| err(format!("application name: {e:?}")))
    };
    let sink_name = |n: usize| -> Result<AppName, LabError> {
        format!("sink-{}", exp.nodes[n])
            .parse()
            .map_err(|e| err(format!("node name: {e:?}")))
    };
    let now = world.now();
    for (i, a) in exp.apps.iter().enumerate() {
        let echo = a.role == AppRole::Echo;
        world.schedule(
            now,
            id_of[&a.node],
            Cmd::Register {
                name: app_name(i)?,
                echo,
            },
        );
    }
    let mut sinks: Vec<usize> = exp
        .flows
        .iter()
        .filter_map(|f| match f.to {
            Dest::Node(n) => Some(n),
            Dest::App(_) => None,
        })
        .collect();
    sinks.sort_unstable();
    sinks.dedup();
    for &n in &sinks {
        let echo = exp
            .flows
            .iter()
            .any(|f| f.to == Dest::Node(n) && f.kind == TrafficKind::Echo);
        world.schedule(
            now,
            id_of[&n],
            Cmd::Register {
                name: sink_name(n)?,
                echo,
            },
        );
    }
    // Warm-up 2: routing converged and every source resolves its names.
    let remote_of = |f: &crate::resolve::Flow| -> Result<AppName, LabError> {
        match f.to {
            Dest::Node(n) => sink_name(n),
            Dest::App(a) => app_name(a),
        }
    };
    loop {
        step(&mut world)?;
        let addrs: Vec<Address> = d
            .members
            .iter()
            .map(|&m| node(&world, &id_of, m).ipcp.config().address)
            .collect();
        let routed = d.members.iter().all(|&m| {
            let ip = &node(&world, &id_of, m).ipcp;
            ip.routing().is_some_and(|r| {
                let h = r.next_hops();
                addrs
                    .iter()
                    .all(|a| *a == ip.config().address || h.contains_key(a))
            })
        });
        let mut resolved = true;
        for f in &exp.flows {
            if node(&world, &id_of, f.from)
                .ipcp
                .resolve(&remote_of(f)?)
                .is_none()
            {
                resolved = false;
            }
        }
        if routed && resolved {
            break;
        }
        if world.now().as_nanos() > limit {
            return Err(err(
                "routing or the directory did not converge in 120 s".into()
            ));
        }
    }
    // Traffic starts on the next whole second, half a second on.
    let t0 = (world.now().as_nanos() + 500_000_000).div_ceil(1_000_000_000) * 1_000_000_000;
    let rel = |t: u64| (t as f64 - t0 as f64) / 1e9;
    out.timeline.push(TimelineEntry {
        t_s: rel(enrolled),
        what: format!("{} members enrolled in DIF {}", d.members.len(), d.name),
    });
    out.timeline.push(TimelineEntry {
        t_s: rel(world.now().as_nanos()),
        what: "routing converged, names resolved".into(),
    });
    // Clients.
    for (i, f) in exp.flows.iter().enumerate() {
        let mut rng = ChaCha8Rng::seed_from_u64(mix(exp.seed, 0x2000 + i as u64));
        let phase = match &f.profile {
            Some(p) => {
                let gap = p.max_size() as f64 * 8.0 / p.mean_rate_bps().max(1.0);
                rng.gen_range(0..((gap.clamp(0.0, 1.0) * 1e9) as u64).max(1))
            }
            None => 0,
        };
        let spec = ClientSpec {
            kind: f.kind,
            remote: remote_of(f)?,
            qos: QosSpec {
                cube: Some(f.cube),
                ..QosSpec::default()
            },
            profile: f.profile.clone(),
            seed: mix(exp.seed, i as u64),
            phase,
            interval: ns(f.interval),
            size: f.size,
            stop: t0 + ns(f.stop),
        };
        let id = id_of[&f.from];
        world.node_mut(id).specs.insert(i, spec);
        world.schedule(
            Instant::from_nanos(t0 + ns(f.start)),
            id,
            Cmd::Allocate { flow: i },
        );
    }
    // Events.
    let mut app_at: Vec<usize> = exp.apps.iter().map(|a| a.node).collect();
    for e in &exp.events {
        let at = Instant::from_nanos(t0 + ns(e.at));
        match e.what {
            EventKind::LinkDown(l) | EventKind::LinkUp(l) => {
                let link = &exp.links[l];
                let port = l as N1Port + 1;
                for n in [link.a, link.b] {
                    if let Some(&id) = id_of.get(&n) {
                        let cmd = if matches!(e.what, EventKind::LinkDown(_)) {
                            Cmd::PortDown(port)
                        } else {
                            Cmd::PortUp(port)
                        };
                        world.schedule(at, id, cmd);
                    }
                }
            }
            EventKind::AppMove { app, to } => {
                let from = app_at[app];
                app_at[app] = to;
                world.schedule(
                    at,
                    id_of[&from],
                    Cmd::Unregister {
                        name: app_name(app)?,
                    },
                );
                world.schedule(
                    at,
                    id_of[&to],
                    Cmd::Register {
                        name: app_name(app)?,
                        echo: exp.apps[app].role == AppRole::Echo,
                    },
                );
            }
            EventKind::NodeStop(_) | EventKind::NodeStart(_) => {}
        }
        let what = match e.what {
            EventKind::LinkDown(l) => format!("link {} down", exp.links[l].name),
            EventKind::LinkUp(l) => format!("link {} up", exp.links[l].name),
            EventKind::AppMove { app, to } => {
                format!(
                    "application {} moves to {}",
                    exp.apps[app].name, exp.nodes[to]
                )
            }
            _ => "node event (ignored)".into(),
        };
        out.timeline.push(TimelineEntry {
            t_s: ns(e.at) as f64 / 1e9,
            what,
        });
    }
    // Link counters at the start of traffic.
    let counters = |w: &World<LabNode>| -> Vec<(usize, [rina_sim::LinkCounters; 2])> {
        wlinks
            .iter()
            .map(|(&l, &wl)| {
                (
                    l,
                    [
                        w.link_counters(wl, end_addr(l, 0)),
                        w.link_counters(wl, end_addr(l, 1)),
                    ],
                )
            })
            .collect()
    };
    world
        .run_until(Instant::from_nanos(t0))
        .map_err(|e| err(e.to_string()))?;
    let c0 = counters(&world);
    let t_end = t0 + ns(exp.duration);
    let mut c1 = None;
    let last = t_end + ns(DRAIN);
    while world.now().as_nanos() < last {
        if ctx.stopped() {
            return Err(LabError::Interrupted);
        }
        let next = (world.now() + STEP).as_nanos().min(last);
        if world.now().as_nanos() < t_end && next >= t_end {
            world
                .run_until(Instant::from_nanos(t_end))
                .map_err(|e| err(e.to_string()))?;
            c1 = Some(counters(&world));
        }
        world
            .run_until(Instant::from_nanos(next))
            .map_err(|e| err(e.to_string()))?;
        let frac =
            (world.now().as_nanos().saturating_sub(t0)) as f64 / ns(exp.duration).max(1) as f64;
        (ctx.progress)(frac.min(1.0), "simulating (protocol engine)");
    }
    let c1 = c1.unwrap_or_else(|| counters(&world));

    // Results.
    let addr_node: BTreeMap<Address, usize> = d
        .members
        .iter()
        .map(|&m| (node(&world, &id_of, m).ipcp.config().address, m))
        .collect();
    let mut rx: BTreeMap<(usize, u16), &Rx> = BTreeMap::new();
    for &m in &d.members {
        for (k, r) in &node(&world, &id_of, m).rx {
            rx.insert(*k, r);
        }
    }
    let mut res = Reservoir::new(20_000, exp.seed);
    for (i, f) in exp.flows.iter().enumerate() {
        let n = node(&world, &id_of, f.from);
        let mut mine: Vec<&Client> = n.clients.values().filter(|c| c.flow == i).collect();
        mine.sort_by_key(|c| c.attempt);
        // Attempts that never allocated are folded into the next record.
        let mut k = 0u32;
        let mut carried_err: Option<String> = None;
        let total = mine.len();
        for (j, c) in mine.iter().enumerate() {
            if c.allocated_at.is_none() && j + 1 < total {
                carried_err = c.error.clone().or(carried_err);
                continue;
            }
            k += 1;
            let served = c.remote_addr.and_then(|a| addr_node.get(&a).copied());
            let name = if k == 1 {
                f.id.clone()
            } else {
                format!("{}#{k}", f.id)
            };
            if let (Some(a), Some(s)) = (c.allocated_at, served) {
                out.timeline.push(TimelineEntry {
                    t_s: rel(a),
                    what: format!("{name}: allocated, served by {}", exp.nodes[s]),
                });
            }
            if let Some(t) = c.failed_at {
                out.timeline.push(TimelineEntry {
                    t_s: rel(t),
                    what: format!("{name}: {}", c.error.as_deref().unwrap_or("flow ended")),
                });
            }
            let (received, bytes, mut delays) = match f.kind {
                TrafficKind::Echo => (
                    c.rtts.len() as u64,
                    c.rtts.len() as u64 * c.size as u64,
                    c.rtts.iter().map(|r| r / 2.0).collect::<Vec<f64>>(),
                ),
                _ => rx.get(&(i, c.attempt)).map_or((0, 0, Vec::new()), |r| {
                    (r.received, r.bytes, r.delays.clone())
                }),
            };
            for &x in &delays {
                res.offer(&f.class, x);
            }
            let stats = stats_ms(&mut delays);
            let hops = served.and_then(|s| dif_hops(exp, f.from, s));
            let active = f.stop.saturating_sub(f.start).as_secs_f64().max(1e-9);
            out.flows.push(FlowRecord {
                flow: name,
                kind: match f.kind {
                    TrafficKind::Tgen => "tgen",
                    TrafficKind::Echo => "echo",
                    TrafficKind::Perf => "perf",
                }
                .into(),
                class: f.class.clone(),
                dif: d.name.clone(),
                cube: d.cube(f.cube).map_or("-".into(), |c| c.name.clone()),
                src: exp.nodes[f.from].clone(),
                dst: match f.to {
                    Dest::Node(n) => exp.nodes[n].clone(),
                    Dest::App(a) => exp.apps[a].name.clone(),
                },
                served_by: served.map(|s| exp.nodes[s].clone()),
                hops,
                sdu_bytes: if c.sent == 0 {
                    0.0
                } else {
                    c.sent_bytes as f64 / c.sent as f64
                },
                sent: c.sent,
                received: received.min(c.sent),
                loss_pct: if c.sent == 0 {
                    0.0
                } else {
                    100.0 * c.sent.saturating_sub(received) as f64 / c.sent as f64
                },
                delay_min_ms: stats.map(|x| x.0),
                delay_avg_ms: stats.map(|x| x.1),
                delay_p99_ms: stats.map(|x| x.2),
                delay_max_ms: stats.map(|x| x.3),
                rtt_avg_ms: (f.kind == TrafficKind::Echo && !c.rtts.is_empty())
                    .then(|| c.rtts.iter().sum::<f64>() / c.rtts.len() as f64),
                goodput_bps: bytes as f64 * 8.0 / active,
                allocation_ms: c
                    .allocated_at
                    .map(|a| a.saturating_sub(c.requested_at) as f64 / 1e6),
                error: if c.allocated_at.is_none() {
                    c.error.clone().or(carried_err.take())
                } else {
                    None
                },
            });
        }
    }
    out.samples = res.into_samples();
    let dur = exp.duration.as_secs_f64().max(1e-9);
    let before: BTreeMap<usize, [rina_sim::LinkCounters; 2]> = c0.into_iter().collect();
    let after: BTreeMap<usize, [rina_sim::LinkCounters; 2]> = c1.into_iter().collect();
    for (l, link) in exp.links.iter().enumerate() {
        let (mut ab, mut ba, mut dropped) = (0.0, 0.0, 0);
        if let (Some(b), Some(a)) = (before.get(&l), after.get(&l)) {
            let bits = |x: &rina_sim::LinkCounters, y: &rina_sim::LinkCounters| {
                ((x.bytes_delivered - y.bytes_delivered)
                    + (x.delivered - y.delivered) * LINK_OVERHEAD as u64) as f64
                    * 8.0
                    / dur
            };
            ab = bits(&a[0], &b[0]);
            ba = bits(&a[1], &b[1]);
            for s in 0..2 {
                dropped += (a[s].dropped_loss + a[s].dropped_queue)
                    - (b[s].dropped_loss + b[s].dropped_queue);
            }
        }
        out.links.push(LinkRecord {
            link: link.name.clone(),
            rate_bps: link.rate_bps,
            avg_bps_ab: ab,
            avg_bps_ba: ba,
            dropped,
        });
    }
    out.timeline.sort_by(|a, b| a.t_s.total_cmp(&b.t_s));
    Ok(world.steps())
}

/// Hops between two members on the DIF's full adjacency graph.
fn dif_hops(exp: &Experiment, from: usize, to: usize) -> Option<u32> {
    let d = &exp.difs[0];
    let mut dist = vec![u32::MAX; exp.nodes.len()];
    dist[from] = 0;
    let mut q = VecDeque::from([from]);
    while let Some(x) = q.pop_front() {
        for a in &d.adjacencies {
            let y = if a.a == x {
                a.b
            } else if a.b == x {
                a.a
            } else {
                continue;
            };
            if dist[y] == u32::MAX {
                dist[y] = dist[x] + 1;
                q.push_back(y);
            }
        }
    }
    (dist[to] != u32::MAX).then_some(dist[to])
}
