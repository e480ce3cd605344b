//! The protocol engine: one `rina-core` [`System`] per node — a shim-udp
//! IPCP per link end and a normal IPCP per DIF the node is a member of,
//! stacked as the experiment says — on `rina-sim`'s world and emulated
//! links. Every DIF's members enroll through its bootstrap member (hellos,
//! password, address grant) and run link-state routing and the
//! disseminated directory; the systems' resource allocators set up the
//! N-1 flows (one lane per lower cube in use), the shims pace them at the
//! link's rate so PDUs queue in each DIF's RMT under its scheduling policy,
//! and the flows are allocated by name and carried by EFCP. Applications
//! are in-sim: echo servers write every SDU back, sinks time-stamp what
//! arrives; clients follow tgen schedules or send echo probes. See the
//! module doc of [`super`].

mod perf;

use super::{mix, LINK_MTU, LINK_OVERHEAD};
use crate::backend::stack;
use crate::backend::RunCtx;
use crate::model::{AppRole, TrafficKind};
use crate::resolve::{Dest, EventKind, Experiment, Over};
use crate::results::{stats_ms, FlowRecord, LinkRecord, Reservoir, RunOutput, TimelineEntry};
use crate::LabError;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rina_core::ids::IdMap;
use rina_core::normal::MembershipConfig;
use rina_core::rmt::Address;
use rina_core::shim_udp;
use rina_core::system::{AppEvent, MediumId, NeighborSpec, Output, PortId, System};
use rina_core::Instant;
use rina_sim::backlog::LinkBacklogs;
use rina_sim::world::Ctx;
use rina_sim::{LinkConfig, Node, World};
use rina_tools::tgen::gen::{Generator, Packet as GenPacket};
use rina_wire::{AppName, QosSpec};
use std::collections::{BTreeMap, VecDeque};
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
/// Step of the driving loop (progress).
const STEP: Duration = Duration::from_millis(50);
/// Most events run between two looks at the stop flag: however dense the
/// events, a stop asked for is seen within a fraction of a second (at
/// 50 ms of virtual time, a run with events every few ns ignored it for
/// hours).
const STOP_EVERY: u64 = 20_000;

/// Whether the protocol engine can run `exp`, or why not. `work_cap`
/// bounds the traffic offered over the run (bits, see [`offered_bits`])
/// when the engine was not asked for by name.
pub(super) fn eligible(exp: &Experiment, work_cap: Option<f64>) -> Result<(), String> {
    if exp.links.len() > 60_000 || exp.flows.len() > 60_000 {
        return Err("more than 60 000 links or flows".into());
    }
    let offered = offered_bits(exp)?;
    if let Some(cap) = work_cap.filter(|&c| offered > c) {
        return Err(format!(
            "{:.0} Gbit of tgen, echo and perf traffic offered over the run (more than {:.0} Gbit, \
             minutes of simulation: ask for it with --engine protocol)",
            offered / 1e9,
            cap / 1e9
        ));
    }
    Ok(())
}

/// The bits the experiment's traffic offers over its run: each tgen source
/// its mean rate, each echo client its probes and their replies, and each
/// perf sender the fastest link at its node (at most at its destination's),
/// over the time it runs. What the protocol
/// engine's work grows with: it simulates every PDU of every layer.
fn offered_bits(exp: &Experiment) -> Result<f64, String> {
    // A perf sender fills what its node's links carry, at most what the
    // destination's take.
    let fastest = |n: usize| {
        exp.links
            .iter()
            .filter(|l| l.a == n || l.b == n)
            .map(|l| l.rate_bps)
            .fold(0.0, f64::max)
    };
    let mut bits = 0.0;
    for f in &exp.flows {
        let secs = f
            .stop
            .min(exp.duration)
            .saturating_sub(f.start)
            .as_secs_f64();
        let rate = match f.kind {
            TrafficKind::Perf => {
                let from = fastest(f.from);
                if from >= crate::resolve::UNLIMITED_BPS {
                    return Err("perf traffic from a node with a link without a rate".into());
                }
                from.min(fastest(exp.dest_node(f.to)))
            }
            // A probe and its reply every interval.
            TrafficKind::Echo => 2.0 * f.size as f64 * 8.0 / f.interval.as_secs_f64().max(1e-9),
            _ => f.profile.as_ref().map_or(0.0, |p| p.mean_rate_bps()),
        };
        bits += rate * secs;
    }
    Ok(bits)
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
    /// A perf client's sweep.
    perf: Option<perf::PerfClient>,
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
    Allocate {
        flow: usize,
    },
    Register {
        dif: String,
        name: AppName,
        echo: bool,
    },
    Unregister {
        dif: String,
        name: AppName,
    },
    LinkDown(usize),
    LinkUp(usize),
    /// The node stops: its system is dropped, its processes end.
    NodeStop,
    /// The node starts again with this system, built as at the start (its
    /// members enroll again).
    NodeStart(Box<LabNode>),
}

/// A simulated system: its [`System`] and the in-sim applications.
#[derive(Debug)]
struct LabNode {
    sys: System,
    /// Per medium (a shim member): this end's address and the link.
    media: BTreeMap<MediumId, (SocketAddr, usize)>,
    by_addr: IdMap<SocketAddr, MediumId>,
    /// Media whose link is down.
    down: std::collections::BTreeSet<MediumId>,
    /// Frames a full link pushed back, per medium, in order.
    backlog: LinkBacklogs,
    names: BTreeMap<AppName, bool>,
    /// Accepted flows: name they were accepted for, echo.
    accepted: BTreeMap<PortId, (AppName, bool)>,
    clients: BTreeMap<PortId, Client>,
    /// Client of each experiment flow here: latest port and the retry time
    /// if it must allocate again.
    latest: BTreeMap<usize, (PortId, Option<u64>)>,
    /// Attempts so far per experiment flow.
    attempts: BTreeMap<usize, u16>,
    rx: BTreeMap<(usize, u16), Rx>,
    /// Set up by the engine: flows this node is the client of.
    specs: BTreeMap<usize, ClientSpec>,
    /// The perf receivers of accepted flows that carry perf tests.
    perf_rx: BTreeMap<PortId, rina_tools::perf::Receiver>,
    /// The wall-clock instant that stands for virtual time 0 for the perf
    /// receivers (they only take differences).
    origin: std::time::Instant,
    /// A perf writer stopped at its share of one wake-up with room left
    /// (a flow over a link shim, whose frames go straight to the link):
    /// it writes on at the same time, once the world has taken what it
    /// wrote to the link (which pushes back when its queue is full).
    perf_more: Option<Instant>,
    /// Names registered here, with their DIF (registered again when the
    /// node starts again).
    regs: Vec<(String, AppName)>,
    /// Registrations the system took not yet (its member still enrolls).
    pending_regs: Vec<(String, AppName)>,
    /// The node is stopped: no system runs.
    stopped: bool,
}

#[derive(Debug, Clone)]
struct ClientSpec {
    kind: TrafficKind,
    dif: String,
    remote: AppName,
    qos: QosSpec,
    profile: Option<rina_tools::tgen::gen::Profile>,
    seed: u64,
    phase: u64,
    interval: u64,
    size: usize,
    stop: u64,
    /// perf: SDU sizes and ns per size.
    sizes: Vec<usize>,
    per_size: u64,
}

impl LabNode {
    fn new(sys: System) -> Self {
        LabNode {
            sys,
            media: BTreeMap::new(),
            by_addr: IdMap::default(),
            down: Default::default(),
            backlog: LinkBacklogs::default(),
            names: BTreeMap::new(),
            accepted: BTreeMap::new(),
            clients: BTreeMap::new(),
            latest: BTreeMap::new(),
            attempts: BTreeMap::new(),
            rx: BTreeMap::new(),
            specs: BTreeMap::new(),
            perf_rx: BTreeMap::new(),
            origin: std::time::Instant::now(),
            perf_more: None,
            regs: Vec::new(),
            pending_regs: Vec::new(),
            stopped: false,
        }
    }

    fn allocate(&mut self, now: u64, flow: usize) {
        let Some(spec) = self.specs.get(&flow).cloned() else {
            return;
        };
        if now >= spec.stop {
            if let Some(l) = self.latest.get_mut(&flow) {
                l.1 = None;
            }
            return;
        }
        let attempt = self.attempts.entry(flow).or_insert(0);
        *attempt += 1;
        let attempt = *attempt;
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
            perf: (spec.kind == TrafficKind::Perf).then(|| {
                let first = u32::from(attempt) << 8;
                perf::PerfClient::new(&spec.sizes, spec.per_size, spec.stop, first)
            }),
        };
        if let Some(p) = &spec.profile {
            let mut g = Generator::new(p.clone(), spec.seed);
            c.pending = g.next();
            c.gen = Some(g);
        }
        let t = Instant::from_nanos(now);
        match self
            .sys
            .allocate(t, Some(&spec.dif), local, spec.remote.clone(), spec.qos)
        {
            Ok(port) => {
                self.latest.insert(flow, (port, None));
                self.clients.insert(port, c);
            }
            Err(e) => {
                // Kept under a port no flow uses, for the record.
                let port = PortId::MAX - (flow as PortId * 64 + PortId::from(attempt % 64));
                c.state = ClientState::Done;
                c.failed_at = Some(now);
                c.error = Some(e.to_string());
                self.latest.insert(flow, (port, Some(now + ns(RETRY))));
                self.clients.insert(port, c);
            }
        }
    }

    fn open(&mut self, now: u64, port: PortId) {
        let remote = self
            .sys
            .flow_member(port)
            .and_then(|i| self.sys.member(i))
            .and_then(|m| m.normal())
            .and_then(|n| {
                n.flows()
                    .find(|(f, _)| *f == port)
                    .map(|(_, ep)| ep.remote_addr)
            });
        let phase = self
            .clients
            .get(&port)
            .and_then(|c| self.specs.get(&c.flow))
            .map_or(0, |s| s.phase);
        let Some(c) = self.clients.get_mut(&port) else {
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

    fn failed(&mut self, now: u64, port: PortId, why: String) {
        let Some(c) = self.clients.get_mut(&port) else {
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
        if self.latest.get(&flow).map(|x| x.0) == Some(port) {
            self.latest.insert(flow, (port, Some(now + ns(RETRY))));
        }
    }

    /// Writes what the perf clients can: their control SDUs due, then DATA
    /// while the flow takes it and the system's queues have room.
    fn run_perf(&mut self, now: u64) {
        let t = Instant::from_nanos(now);
        self.perf_more = None;
        let ports: Vec<PortId> = self
            .clients
            .iter()
            .filter(|(_, c)| c.state == ClientState::Open && c.perf.is_some())
            .map(|(p, _)| *p)
            .collect();
        for port in ports {
            let Some(p) = self.clients.get_mut(&port).and_then(|c| c.perf.as_mut()) else {
                continue;
            };
            // Control SDUs first and in order; one a full flow refuses
            // waits until the flow is writable, as `rina-perf` blocks.
            p.control(now);
            while let Some(sdu) = p.next_control() {
                match self.sys.write(t, port, sdu) {
                    Err(rina_core::system::FlowError::WouldBlock) => {
                        p.blocked = true;
                        break;
                    }
                    _ => p.control_taken(),
                }
            }
            for _ in 0..self.perf_room().min(perf::BURST_SDUS) {
                let Some(p) = self.clients.get_mut(&port).and_then(|c| c.perf.as_mut()) else {
                    break;
                };
                if p.blocked {
                    break;
                }
                let Some(sdu) = p.data() else { break };
                match self.sys.write(t, port, &sdu) {
                    Ok(()) => p.wrote(sdu.len()),
                    Err(rina_core::system::FlowError::WouldBlock) => {
                        p.blocked = true;
                        break;
                    }
                    Err(_) => break,
                }
            }
            let room = self.perf_room();
            if let Some(c) = self.clients.get_mut(&port) {
                c.next_at = c.perf.as_ref().and_then(|p| p.next_at());
                if room > 0 && c.perf.as_ref().is_some_and(|p| !p.blocked && p.sending()) {
                    self.perf_more = Some(t);
                }
            }
        }
    }

    /// SDUs a perf writer may write now: what its own system may still
    /// hold in its RMT queues and in the frames a full link pushed back.
    fn perf_room(&self) -> usize {
        let backlog = self.backlog.frames();
        let queued: usize = self
            .sys
            .members()
            .iter()
            .filter_map(|m| m.normal())
            .map(|n| n.rmt().queued())
            .sum();
        perf::BUFFER_PDUS.saturating_sub(queued + backlog)
    }

    /// Writes what the clients have due.
    fn run_clients(&mut self, now: u64) {
        self.run_perf(now);
        let t = Instant::from_nanos(now);
        let due: Vec<PortId> = self
            .clients
            .iter()
            .filter(|(_, c)| c.state == ClientState::Open && c.perf.is_none())
            .filter(|(_, c)| c.next_at.is_some_and(|x| x <= now))
            .map(|(f, _)| *f)
            .collect();
        for port in due {
            while let Some(c) = self.clients.get_mut(&port) {
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
                // An SDU a flow cannot take is lost to the application, as
                // an unreliable socket write would be.
                let _ = self.sys.write(t, port, &sdu);
            }
        }
    }

    fn pump(&mut self, ctx: &mut Ctx<'_, ()>) {
        let now = ctx.now().as_nanos();
        self.run_clients(now);
        // Perf writers write again as what they wrote leaves (a few rounds:
        // each either fills the queues or finds the flow blocked).
        for _ in 0..4 {
            let mut any = false;
            while let Some(o) = self.sys.poll_output() {
                any = true;
                self.on_output(ctx, o);
            }
            if !any || !self.clients.values().any(|c| c.perf.is_some()) {
                break;
            }
            self.run_perf(now);
        }
    }

    fn on_output(&mut self, ctx: &mut Ctx<'_, ()>, o: Output) {
        let now = ctx.now();
        let t = now.as_nanos();
        match o {
            // The simulator's media are UDP links: every frame has a peer.
            Output::ToMedium { peer: None, .. }
            | Output::Membership { .. }
            | Output::RibRead { .. }
            | Output::Alarm { .. } => {}
            Output::ToMedium {
                medium,
                peer: Some(peer),
                frame,
            } => {
                // Behind frames the link pushed back, if any: in order.
                let frame = self.backlog.queue_behind(medium, peer, frame.into_vec());
                let local = self.media.get(&medium).map(|&(local, _)| local);
                if let (Some(frame), Some(local)) = (frame, local) {
                    if !self.down.contains(&medium) {
                        ctx.transmit(local, peer, frame);
                    }
                }
            }
            Output::ToApp { port, sdu } => self.on_sdu(now, port, &sdu.into_buf()),
            Output::App(AppEvent::FlowRequest { handle, local, .. }) => {
                match self.names.get(&*local).copied() {
                    Some(echo) => {
                        if let Ok((port, _)) = self.sys.accept(now, handle) {
                            self.accepted.insert(port, (*local, echo));
                        }
                    }
                    None => {
                        let _ = self.sys.refuse(now, handle, "not registered here");
                    }
                }
            }
            Output::App(AppEvent::Allocated { port, .. }) => self.open(t, port),
            Output::App(AppEvent::AllocateFailed { port, error }) => {
                self.failed(t, port, error.to_string())
            }
            Output::App(AppEvent::Deallocated { port }) => {
                self.accepted.remove(&port);
                self.perf_rx.remove(&port);
                self.failed(t, port, "deallocated by the peer".into());
            }
            Output::App(AppEvent::Writable { port }) => {
                if let Some(p) = self.clients.get_mut(&port).and_then(|c| c.perf.as_mut()) {
                    p.blocked = false;
                }
            }
            // The simulated applications read every SDU as it comes: none
            // is held when a flow ends, so no flow is kept for them.
            Output::App(AppEvent::RequestWithdrawn { .. } | AppEvent::HoldExpired { .. }) => {}
        }
    }

    fn on_sdu(&mut self, now: Instant, port: PortId, sdu: &[u8]) {
        if let Some(p) = self.clients.get_mut(&port).and_then(|c| c.perf.as_mut()) {
            p.on_sdu(sdu);
            return;
        }
        if sdu.starts_with(&rina_tools::perf::MAGIC) && self.accepted.contains_key(&port) {
            // A perf test: the tool's receiver answers, on virtual time.
            let at = self.origin + Duration::from_nanos(now.as_nanos());
            let rx = self.perf_rx.entry(port).or_default();
            if let Some(reply) = rx.on_sdu(sdu, at) {
                let _ = self.sys.write(now, port, &reply);
            }
            return;
        }
        if sdu.len() < HDR {
            return;
        }
        let mut b8 = [0u8; 8];
        b8.copy_from_slice(&sdu[8..16]);
        let sent = u64::from_be_bytes(b8);
        let f = u16::from_be_bytes([sdu[16], sdu[17]]) as usize;
        let att = u16::from_be_bytes([sdu[18], sdu[19]]);
        let delay_ms = now.as_nanos().saturating_sub(sent) as f64 / 1e6;
        if let Some(c) = self.clients.get_mut(&port) {
            // An echo reply.
            c.rtts.push(delay_ms);
        } else if let Some((_, echo)) = self.accepted.get(&port) {
            // Counted as data (tgen) whatever the server does with it; an
            // echo server also writes it back (echo probes are measured by
            // the client).
            if *echo {
                let _ = self.sys.write(now, port, sdu);
            }
            let r = self.rx.entry((f, att)).or_default();
            r.received += 1;
            r.bytes += sdu.len() as u64;
            r.delays.push(delay_ms);
        }
    }

    fn on_command(&mut self, now: Instant, cmd: Cmd) {
        match cmd {
            Cmd::Allocate { flow } if self.stopped => {
                // Allocated once the node starts again.
                self.latest.entry(flow).or_insert((PortId::MAX, None));
            }
            Cmd::Allocate { flow } => self.allocate(now.as_nanos(), flow),
            Cmd::Register { dif, name, echo } if self.stopped => {
                // Registered once the node starts again.
                self.names.insert(name.clone(), echo);
                self.regs.push((dif, name));
            }
            Cmd::Register { dif, name, echo } => {
                if self.sys.register(&dif, name.clone()).is_ok() {
                    self.names.insert(name.clone(), echo);
                    self.regs.push((dif, name));
                }
            }
            Cmd::NodeStop => self.stop(now.as_nanos()),
            Cmd::NodeStart(fresh) => self.start(now.as_nanos(), *fresh),
            Cmd::Unregister { dif, name } => {
                self.names.remove(&name);
                self.regs.retain(|(d, n)| !(*d == dif && *n == name));
                self.sys.unregister(&dif, &name);
                // The server process goes: its flows are deallocated.
                let gone: Vec<PortId> = self
                    .accepted
                    .iter()
                    .filter(|(_, (n, _))| *n == name)
                    .map(|(f, _)| *f)
                    .collect();
                for f in gone {
                    self.sys.close(now, f);
                    self.accepted.remove(&f);
                    self.perf_rx.remove(&f);
                }
            }
            Cmd::LinkDown(l) | Cmd::LinkUp(l) => {
                let up = matches!(cmd, Cmd::LinkUp(_));
                let media: Vec<MediumId> = self
                    .media
                    .iter()
                    .filter(|(_, (_, link))| *link == l)
                    .map(|(m, _)| *m)
                    .collect();
                for m in media {
                    if up {
                        self.down.remove(&m);
                        self.sys.medium_up(now, m);
                    } else {
                        self.down.insert(m);
                        self.sys.medium_down(now, m);
                    }
                }
            }
        }
    }
}

impl Node for LabNode {
    type Command = Cmd;
    type Event = ();

    fn addrs(&self) -> Vec<SocketAddr> {
        self.by_addr.keys().copied().collect()
    }

    fn on_datagram(
        &mut self,
        ctx: &mut Ctx<'_, ()>,
        to: SocketAddr,
        from: SocketAddr,
        payload: &[u8],
    ) {
        if self.stopped {
            return;
        }
        if let Some(&m) = self.by_addr.get(&to) {
            if !self.down.contains(&m) {
                self.sys.handle_frame(ctx.now(), m, from, payload);
            }
        }
        self.pump(ctx);
    }

    fn on_timeout(&mut self, ctx: &mut Ctx<'_, ()>) {
        let now = ctx.now();
        if self.stopped {
            return;
        }
        self.register_pending();
        let media = &self.media;
        self.backlog.retry(ctx, &mut self.sys, |m| {
            media.get(&m).map(|&(local, _)| local)
        });
        // The system runs only its members whose timers are due.
        self.sys.handle_timeout(now);
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
        LabNode::on_command(self, ctx.now(), cmd);
        self.pump(ctx);
    }

    fn poll_timeout(&self) -> Option<Instant> {
        if self.stopped {
            return None;
        }
        let clients = self
            .clients
            .values()
            .filter(|c| c.state == ClientState::Open)
            .filter_map(|c| c.next_at);
        let retries = self.latest.values().filter_map(|(_, r)| *r);
        let backlogs = self
            .backlog
            .poll_timeout()
            .into_iter()
            .chain(self.perf_more);
        // Registrations wait for the member's enrollment: looked at again
        // with the system's own timers, and every RETRY at least.
        let regs = (!self.pending_regs.is_empty())
            .then(|| self.sys.poll_timeout().map(|t| t + RETRY))
            .flatten();
        self.sys
            .poll_timeout()
            .into_iter()
            .chain(clients.chain(retries).map(Instant::from_nanos))
            .chain(backlogs)
            .chain(regs)
            .min()
    }

    fn on_link_full(
        &mut self,
        now: Instant,
        from: SocketAddr,
        to: SocketAddr,
        payload: Vec<u8>,
        room_at: Instant,
    ) -> Option<Vec<u8>> {
        // Like a full socket buffer: the frame is kept, and the system
        // holds the N-1 ports over this medium until it has room.
        let Some(&m) = self.by_addr.get(&from) else {
            return Some(payload);
        };
        self.backlog
            .hold(&mut self.sys, now, m, to, payload, room_at);
        None
    }
}

impl LabNode {
    /// The node stops: its processes end (the flows from here fail and
    /// are not tried again while it is stopped; the flows it served end),
    /// and its system is dropped, so its neighbours hear nothing more from
    /// it.
    fn stop(&mut self, now: u64) {
        let open: Vec<PortId> = self
            .clients
            .iter()
            .filter(|(_, c)| c.state != ClientState::Done)
            .map(|(p, _)| *p)
            .collect();
        for p in open {
            self.failed(now, p, "node stopped".into());
        }
        for (_, retry) in self.latest.values_mut() {
            *retry = None;
        }
        self.sys = System::new(self.sys.name().to_string());
        self.accepted.clear();
        self.perf_rx.clear();
        self.backlog.clear();
        self.pending_regs.clear();
        self.stopped = true;
    }

    /// The node starts again with `fresh`'s system: its members enroll
    /// again, its applications register once they can, and the flows from
    /// here that still have time allocate again.
    fn start(&mut self, now: u64, fresh: LabNode) {
        if !self.stopped {
            return;
        }
        self.sys = fresh.sys;
        self.media = fresh.media;
        self.by_addr = fresh.by_addr;
        self.down.clear();
        self.stopped = false;
        self.pending_regs = self.regs.clone();
        self.register_pending();
        let again: Vec<usize> = self
            .specs
            .iter()
            .filter(|(_, s)| s.stop > now)
            .map(|(f, _)| *f)
            .filter(|f| self.latest.contains_key(f))
            .collect();
        for f in again {
            if let Some(l) = self.latest.get_mut(&f) {
                l.1 = Some(now + ns(RETRY));
            }
        }
    }

    /// Registers what waits for its member to be enrolled.
    fn register_pending(&mut self) {
        let sys = &mut self.sys;
        self.pending_regs
            .retain(|(dif, name)| sys.register(dif, name.clone()).is_err());
    }
}

/// The name of node `m`'s IPCP in DIF `d` (also its name in the N-1 DIFs).
fn ipcp_name(exp: &Experiment, m: usize, d: usize) -> Result<AppName, LabError> {
    crate::backend::real::config::ipcp_name(exp, m, d)
        .parse()
        .map_err(|e| LabError::Backend {
            backend: "sim",
            what: format!("IPCP name of node {}: {e:?}", exp.nodes[m]),
        })
}

/// The system of node `m`: a shim-udp per link end, paced at the link's
/// rate, then a normal IPCP per DIF it is a member of, lower DIFs first.
fn node_system(exp: &Experiment, m: usize, generation: u64) -> Result<LabNode, LabError> {
    let err = |what: String| LabError::Backend {
        backend: "sim",
        what,
    };
    let mut sys = System::new(exp.nodes[m].clone());
    let mut media = BTreeMap::new();
    for (l, link) in exp.links.iter().enumerate() {
        let side = match (link.a == m, link.b == m) {
            (true, _) => 0,
            (_, true) => 1,
            _ => continue,
        };
        let peer = if side == 0 { link.b } else { link.a };
        let mut sc = shim_udp::Config::new(link.name.clone());
        // An Ethernet-like link, as the real backends configure it.
        sc.max_sdu = LINK_MTU as u32;
        for (d, dif) in exp.difs.iter().enumerate() {
            let adjacent = dif
                .adjacencies
                .iter()
                .any(|a| a.over == Over::Link(l) && (a.a == m || a.b == m));
            if adjacent {
                sc.directory
                    .insert(ipcp_name(exp, peer, d)?, end_addr(l, 1 - side));
            }
        }
        // The servers of the flows from here directly over this link.
        for f in exp
            .flows
            .iter()
            .filter(|f| f.shim == Some(l) && f.from == m)
        {
            sc.directory
                .insert(remote_of(exp, f)?, end_addr(l, 1 - side));
        }
        // What rinad makes of the shim's `rate` and `rate_overhead` the
        // real backends write: the paced rate, the link's overhead and the
        // shim's own header per frame.
        let rate = stack::udp_port_rate(link);
        let i = sys
            .add_shim_udp(format!("{}.{}", exp.nodes[m], link.name), sc, rate)
            .map_err(|e| err(e.to_string()))?;
        media.insert(i, (end_addr(l, side), l));
    }
    for (d, dif) in exp.difs.iter().enumerate() {
        if !dif.has_member(m) {
            continue;
        }
        let name = ipcp_name(exp, m, d)?;
        let mut c = stack::member_config(exp, m, d, &|_| LINK_MTU);
        let mut mc = MembershipConfig::new(name.clone());
        mc.password = dif.password.clone();
        // Nonces of its own (rinad draws them at random): members that
        // shared them would take each other's hellos for their own
        // reflected. Started again: new ones, and CEP-ids from elsewhere,
        // so that its peers' flows from before are not mistaken for new
        // ones.
        let r = mix(
            exp.seed,
            0x4000 + ((m as u64) << 20) + (generation << 8) + d as u64,
        );
        if generation > 0 {
            c.first_cep = r & 0xffff_ffff;
        }
        for (i, b) in mc.entropy.iter_mut().enumerate() {
            *b = (mix(r, i as u64) & 0xff) as u8;
        }
        c.membership = Some(mc);
        // Neighbours, the one this member enrolls through first.
        let via = dif.enrolls_via.get(&m).copied();
        let mut nbs: Vec<(usize, Over)> = dif
            .adjacencies
            .iter()
            .filter_map(|a| match (a.a == m, a.b == m) {
                (true, _) => Some((a.b, a.over)),
                (_, true) => Some((a.a, a.over)),
                _ => None,
            })
            .collect();
        nbs.sort_by_key(|(p, _)| Some(*p) != via);
        let nbs = nbs
            .into_iter()
            .map(|(p, over)| {
                Ok(NeighborSpec {
                    name: ipcp_name(exp, p, d)?,
                    over: match over {
                        Over::Link(l) => exp.links[l].name.clone(),
                        Over::Dif(x) => exp.difs[x].name.clone(),
                    },
                    address: None,
                })
            })
            .collect::<Result<Vec<_>, LabError>>()?;
        sys.add_normal(name, c, &dif.scheduler, nbs, BTreeMap::new())
            .map_err(|e| err(e.to_string()))?;
    }
    let mut node = LabNode::new(sys);
    node.by_addr = media.iter().map(|(&i, &(a, _))| (a, i)).collect();
    node.media = media;
    Ok(node)
}

/// The address of every member of DIF `d`, by node, once enrolled.
fn addresses(
    w: &World<LabNode>,
    ids: &BTreeMap<usize, usize>,
    exp: &Experiment,
    d: usize,
) -> BTreeMap<usize, Address> {
    exp.difs[d]
        .members
        .iter()
        .filter_map(|&m| {
            let n = w.node(ids[&m]).sys.member_in(&exp.difs[d].name)?;
            let ip = w.node(ids[&m]).sys.member(n)?.normal()?;
            ip.is_enrolled().then(|| (m, ip.config().address))
        })
        .collect()
}

/// The normal IPCP of node `m` in DIF `d`.
fn ipcp_of<'w>(
    w: &'w World<LabNode>,
    ids: &BTreeMap<usize, usize>,
    exp: &Experiment,
    m: usize,
    d: usize,
) -> Option<&'w rina_core::normal::NormalIpcp> {
    let sys = &w.node(ids[&m]).sys;
    sys.member(sys.member_in(&exp.difs[d].name)?)?.normal()
}

/// Node index -> world node id.
type Ids = BTreeMap<usize, usize>;
/// Link index -> world link id.
type LinkIds = BTreeMap<usize, usize>;

fn lab_err(what: String) -> LabError {
    LabError::Backend {
        backend: "sim",
        what,
    }
}

/// One world node per experiment node, and the emulated links.
fn build_world(exp: &Experiment) -> Result<(World<LabNode>, Ids, LinkIds), LabError> {
    let mut world: World<LabNode> = World::new(exp.seed);
    world.set_tracing(false);
    world.set_step_limit(u64::MAX);
    let mut id_of = Ids::new();
    for m in 0..exp.nodes.len() {
        id_of.insert(m, world.add_node(node_system(exp, m, 0)?));
    }
    let mut wlinks = LinkIds::new();
    for (l, link) in exp.links.iter().enumerate() {
        let cfg = LinkConfig {
            rate_bps: (link.rate_bps < crate::resolve::UNLIMITED_BPS)
                .then_some(link.rate_bps as u64),
            delay: link.delay,
            jitter: Duration::ZERO,
            loss: link.loss,
            queue_packets: link.queue,
            overhead_bytes: LINK_OVERHEAD as u32,
        };
        wlinks.insert(l, world.connect(end_addr(l, 0), end_addr(l, 1), cfg));
    }
    Ok((world, id_of, wlinks))
}

fn app_name(exp: &Experiment, a: usize) -> Result<AppName, LabError> {
    exp.apps[a]
        .name
        .parse()
        .map_err(|e| lab_err(format!("application name: {e:?}")))
}

/// The receiver at node `n` of flows of `kind`: `echo-<node>` for echo
/// flows, `sink-<node>` for the others. Two names, as the real backend
/// runs two tools: one receiver for both would echo the tgen data back
/// (seed 003's probes turned every HR's sink into an echo server, which
/// wrote all it received back toward the PEs).
fn sink_name(exp: &Experiment, n: usize, kind: TrafficKind) -> Result<AppName, LabError> {
    let role = match kind {
        TrafficKind::Echo => "echo",
        _ => "sink",
    };
    format!("{role}-{}", exp.nodes[n])
        .parse()
        .map_err(|e| lab_err(format!("node name: {e:?}")))
}

/// The DIF flow `f` allocates in: its link's shim DIF or its normal DIF.
fn flow_dif(exp: &Experiment, f: &crate::resolve::Flow) -> String {
    match f.shim {
        Some(l) => exp.links[l].name.clone(),
        None => exp.difs[f.dif].name.clone(),
    }
}

/// The name of flow `f`'s cube (none over a link shim, as the real
/// backends record it).
fn flow_cube(exp: &Experiment, f: &crate::resolve::Flow) -> String {
    match f.shim {
        Some(_) => String::new(),
        None => exp.difs[f.dif]
            .cube(f.cube)
            .map_or("-".into(), |c| c.name.clone()),
    }
}

/// The node that served an allocation of flow `f`: the member whose
/// address answered, or the other end of the link of a flow directly
/// over a link shim.
fn served_by(
    exp: &Experiment,
    f: &crate::resolve::Flow,
    c: &Client,
    addr_node: &[BTreeMap<Address, usize>],
) -> Option<usize> {
    match f.shim {
        Some(l) => {
            let link = &exp.links[l];
            c.allocated_at?;
            Some(if link.a == f.from { link.b } else { link.a })
        }
        None => c
            .remote_addr
            .and_then(|a| addr_node[f.dif].get(&a).copied()),
    }
}

/// Hops of an allocation of flow `f` served by `s`: in its DIF, or the one
/// link of a flow directly over a link shim.
fn flow_hops(exp: &Experiment, f: &crate::resolve::Flow, s: usize) -> Option<u32> {
    match f.shim {
        Some(_) => Some(1),
        None => dif_hops(exp, f.dif, f.from, s),
    }
}

fn remote_of(exp: &Experiment, f: &crate::resolve::Flow) -> Result<AppName, LabError> {
    match f.to {
        Dest::Node(n) => sink_name(exp, n, f.kind),
        Dest::App(a) => app_name(exp, a),
    }
}

/// Runs the world 100 ms further (or stops if asked).
fn step(w: &mut World<LabNode>, ctx: &RunCtx<'_>) -> Result<(), LabError> {
    let t = w.now() + Duration::from_millis(100);
    run_to(w, t, &|| ctx.stopped())
}

/// Runs the world until `until`, looking at `stopped` before every
/// [`STOP_EVERY`] events: [`LabError::Interrupted`] once it is true.
fn run_to<N: Node>(
    w: &mut World<N>,
    until: Instant,
    stopped: &dyn Fn() -> bool,
) -> Result<(), LabError> {
    loop {
        if stopped() {
            return Err(LabError::Interrupted);
        }
        let (_, reached) = w
            .run_until_at_most(until, STOP_EVERY)
            .map_err(|e| lab_err(e.to_string()))?;
        if reached {
            return Ok(());
        }
    }
}

/// Runs until every member of every DIF is enrolled; returns when.
fn warm_up_enrollment(
    world: &mut World<LabNode>,
    ids: &Ids,
    exp: &Experiment,
    ctx: &RunCtx<'_>,
) -> Result<u64, LabError> {
    let enrolled = |w: &World<LabNode>| {
        (0..exp.difs.len()).all(|d| addresses(w, ids, exp, d).len() == exp.difs[d].members.len())
    };
    while !enrolled(world) {
        if world.now().as_nanos() > ns(WARMUP_LIMIT) {
            return Err(lab_err(
                "members did not all enroll in 120 s of virtual time".into(),
            ));
        }
        step(world, ctx)?;
        (ctx.progress)(0.0, "enrolling");
    }
    Ok(world.now().as_nanos())
}

/// Registers the applications and a sink per destination node.
fn register_apps(world: &mut World<LabNode>, ids: &Ids, exp: &Experiment) -> Result<(), LabError> {
    let now = world.now();
    for (i, a) in exp.apps.iter().enumerate() {
        let cmd = Cmd::Register {
            dif: exp.difs[a.dif].name.clone(),
            name: app_name(exp, i)?,
            echo: a.role == AppRole::Echo,
        };
        world.schedule(now, ids[&a.node], cmd);
    }
    // Applications reached directly over a link: registered in its shim too.
    let mut on_shims: Vec<(usize, usize)> = exp
        .flows
        .iter()
        .filter_map(|f| match (f.shim, f.to) {
            (Some(l), Dest::App(a)) => Some((a, l)),
            _ => None,
        })
        .collect();
    on_shims.sort_unstable();
    on_shims.dedup();
    for (a, l) in on_shims {
        let app = &exp.apps[a];
        let cmd = Cmd::Register {
            dif: exp.links[l].name.clone(),
            name: app_name(exp, a)?,
            echo: app.role == AppRole::Echo,
        };
        world.schedule(now, ids[&app.node], cmd);
    }
    let mut sinks: Vec<(usize, String, bool)> = exp
        .flows
        .iter()
        .filter_map(|f| match f.to {
            Dest::Node(n) => Some((n, flow_dif(exp, f), f.kind == TrafficKind::Echo)),
            Dest::App(_) => None,
        })
        .collect();
    sinks.sort_unstable();
    sinks.dedup();
    for (n, dif, echo) in sinks {
        let kind = if echo {
            TrafficKind::Echo
        } else {
            TrafficKind::Tgen
        };
        let cmd = Cmd::Register {
            dif,
            name: sink_name(exp, n, kind)?,
            echo,
        };
        world.schedule(now, ids[&n], cmd);
    }
    Ok(())
}

/// Runs until routing converged in every DIF and every source resolves
/// its destination's name.
fn warm_up_routing(
    world: &mut World<LabNode>,
    ids: &Ids,
    exp: &Experiment,
    ctx: &RunCtx<'_>,
) -> Result<(), LabError> {
    loop {
        step(world, ctx)?;
        let routed = (0..exp.difs.len()).all(|d| {
            let addrs = addresses(world, ids, exp, d);
            exp.difs[d].members.iter().all(|&m| {
                ipcp_of(world, ids, exp, m, d)
                    .and_then(|ip| ip.routing().map(|r| (ip.config().address, r)))
                    .is_some_and(|(me, r)| {
                        let h = r.next_hops();
                        addrs.values().all(|a| *a == me || h.contains_key(a))
                    })
            })
        });
        let mut resolved = true;
        for f in exp.flows.iter().filter(|f| f.shim.is_none()) {
            let remote = remote_of(exp, f)?;
            if ipcp_of(world, ids, exp, f.from, f.dif)
                .and_then(|ip| ip.resolve(&remote))
                .is_none()
            {
                resolved = false;
            }
        }
        if routed && resolved {
            return Ok(());
        }
        if world.now().as_nanos() > ns(WARMUP_LIMIT) {
            return Err(lab_err(
                "routing or the directory did not converge in 120 s of virtual time".into(),
            ));
        }
    }
}

/// Gives each source node its clients, starting at `t0`.
fn schedule_clients(
    world: &mut World<LabNode>,
    ids: &Ids,
    exp: &Experiment,
    t0: u64,
) -> Result<(), LabError> {
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
            dif: flow_dif(exp, f),
            remote: remote_of(exp, f)?,
            // A shim DIF has no cubes: the real tools ask for none there.
            qos: QosSpec {
                cube: f.shim.is_none().then_some(f.cube),
                ..QosSpec::default()
            },
            profile: f.profile.clone(),
            seed: mix(exp.seed, i as u64),
            phase,
            interval: ns(f.interval),
            size: f.size,
            stop: t0 + ns(f.stop),
            sizes: f.sdu_sizes.clone(),
            per_size: ns(f.per_size),
        };
        let id = ids[&f.from];
        world.node_mut(id).specs.insert(i, spec);
        world.schedule(
            Instant::from_nanos(t0 + ns(f.start)),
            id,
            Cmd::Allocate { flow: i },
        );
    }
    Ok(())
}

/// Schedules the experiment's events and notes them in the timeline.
fn schedule_events(
    world: &mut World<LabNode>,
    ids: &Ids,
    exp: &Experiment,
    t0: u64,
    out: &mut RunOutput,
) -> Result<(), LabError> {
    let mut app_at: Vec<usize> = exp.apps.iter().map(|a| a.node).collect();
    let mut generation: BTreeMap<usize, u64> = BTreeMap::new();
    for e in &exp.events {
        let at = Instant::from_nanos(t0 + ns(e.at));
        let what = match e.what {
            EventKind::LinkDown(l) | EventKind::LinkUp(l) => {
                let link = &exp.links[l];
                let down = matches!(e.what, EventKind::LinkDown(_));
                for n in [link.a, link.b] {
                    let cmd = if down {
                        Cmd::LinkDown(l)
                    } else {
                        Cmd::LinkUp(l)
                    };
                    world.schedule(at, ids[&n], cmd);
                }
                format!("link {} {}", link.name, if down { "down" } else { "up" })
            }
            EventKind::AppMove { app, to } => {
                let from = std::mem::replace(&mut app_at[app], to);
                let dif = exp.difs[exp.apps[app].dif].name.clone();
                let name = app_name(exp, app)?;
                let unreg = Cmd::Unregister {
                    dif: dif.clone(),
                    name: name.clone(),
                };
                world.schedule(at, ids[&from], unreg);
                let echo = exp.apps[app].role == AppRole::Echo;
                world.schedule(at, ids[&to], Cmd::Register { dif, name, echo });
                format!(
                    "application {} moves to {}",
                    exp.apps[app].name, exp.nodes[to]
                )
            }
            EventKind::NodeStop(n) => {
                world.schedule(at, ids[&n], Cmd::NodeStop);
                format!("node {} stops", exp.nodes[n])
            }
            EventKind::NodeStart(n) => {
                let g = generation.entry(n).or_insert(0);
                *g += 1;
                let fresh = node_system(exp, n, *g)?;
                world.schedule(at, ids[&n], Cmd::NodeStart(Box::new(fresh)));
                format!("node {} starts", exp.nodes[n])
            }
        };
        out.timeline.push(TimelineEntry {
            t_s: ns(e.at) as f64 / 1e9,
            what,
        });
    }
    Ok(())
}

type LinkSnapshot = BTreeMap<usize, [rina_sim::LinkCounters; 2]>;

fn link_counters(w: &World<LabNode>, wlinks: &LinkIds) -> LinkSnapshot {
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
}

/// Runs `exp` on the protocol machines.
pub(super) fn run(
    exp: &Experiment,
    ctx: &RunCtx<'_>,
    out: &mut RunOutput,
) -> Result<u64, LabError> {
    let (mut world, ids, wlinks) = build_world(exp)?;
    let enrolled = warm_up_enrollment(&mut world, &ids, exp, ctx)?;
    register_apps(&mut world, &ids, exp)?;
    warm_up_routing(&mut world, &ids, exp, ctx)?;
    // Traffic starts on the next whole second, half a second on.
    let t0 = (world.now().as_nanos() + 500_000_000).div_ceil(1_000_000_000) * 1_000_000_000;
    let rel = |t: u64| (t as f64 - t0 as f64) / 1e9;
    let members: usize = exp.difs.iter().map(|d| d.members.len()).sum();
    out.timeline.push(TimelineEntry {
        t_s: rel(enrolled),
        what: format!("{members} members enrolled in {} DIF(s)", exp.difs.len()),
    });
    out.timeline.push(TimelineEntry {
        t_s: rel(world.now().as_nanos()),
        what: "routing converged, names resolved".into(),
    });
    schedule_clients(&mut world, &ids, exp, t0)?;
    schedule_events(&mut world, &ids, exp, t0, out)?;
    let stopped = || ctx.stopped();
    run_to(&mut world, Instant::from_nanos(t0), &stopped)?;
    let c0 = link_counters(&world, &wlinks);
    let t_end = t0 + ns(exp.duration);
    let mut c1 = None;
    let last = t_end + ns(DRAIN);
    while world.now().as_nanos() < last {
        let next = (world.now() + STEP).as_nanos().min(last);
        if world.now().as_nanos() < t_end && next >= t_end {
            run_to(&mut world, Instant::from_nanos(t_end), &stopped)?;
            c1 = Some(link_counters(&world, &wlinks));
        }
        run_to(&mut world, Instant::from_nanos(next), &stopped)?;
        let frac =
            (world.now().as_nanos().saturating_sub(t0)) as f64 / ns(exp.duration).max(1) as f64;
        (ctx.progress)(frac.min(1.0), "simulating (protocol engine)");
    }
    let c1 = c1.unwrap_or_else(|| link_counters(&world, &wlinks));
    flow_records(&world, &ids, exp, t0, out);
    link_records(exp, &c0, &c1, out);
    out.timeline.sort_by(|a, b| a.t_s.total_cmp(&b.t_s));
    Ok(world.steps())
}

/// One record per allocation of every flow, with its delays.
fn flow_records(world: &World<LabNode>, ids: &Ids, exp: &Experiment, t0: u64, out: &mut RunOutput) {
    let rel = |t: u64| (t as f64 - t0 as f64) / 1e9;
    let addr_node: Vec<BTreeMap<Address, usize>> = (0..exp.difs.len())
        .map(|d| {
            addresses(world, ids, exp, d)
                .into_iter()
                .map(|(m, a)| (a, m))
                .collect()
        })
        .collect();
    let mut rx: BTreeMap<(usize, u16), &Rx> = BTreeMap::new();
    for &id in ids.values() {
        for (k, r) in &world.node(id).rx {
            rx.insert(*k, r);
        }
    }
    let mut res = Reservoir::new(20_000, exp.seed);
    for (i, f) in exp.flows.iter().enumerate() {
        let n = world.node(ids[&f.from]);
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
            let served = served_by(exp, f, c, &addr_node);
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
            if let Some(p) = &c.perf {
                out.flows.push(perf_flow_record(
                    exp,
                    i,
                    name,
                    served,
                    c,
                    p,
                    &mut out.goodput,
                ));
                continue;
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
            let active = f.stop.saturating_sub(f.start).as_secs_f64().max(1e-9);
            out.flows.push(FlowRecord {
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
                error: if c.allocated_at.is_none() {
                    c.error.clone().or(carried_err.take())
                } else {
                    None
                },
                ..record_head(exp, i, name, served, c)
            });
        }
    }
    out.samples = res.into_samples();
}

/// What every record of flow `i`'s allocation `name` says whatever its
/// traffic: the flow, its ends, who served it, and how long the
/// allocation took; the rest is left at its default.
fn record_head(
    exp: &Experiment,
    i: usize,
    name: String,
    served: Option<usize>,
    c: &Client,
) -> FlowRecord {
    let f = &exp.flows[i];
    FlowRecord {
        flow: name,
        kind: match f.kind {
            TrafficKind::Tgen => "tgen",
            TrafficKind::Echo => "echo",
            TrafficKind::Perf => "perf",
        }
        .into(),
        class: f.class.clone(),
        dif: flow_dif(exp, f),
        cube: flow_cube(exp, f),
        src: exp.nodes[f.from].clone(),
        dst: match f.to {
            Dest::Node(n) => exp.nodes[n].clone(),
            Dest::App(a) => exp.apps[a].name.clone(),
        },
        served_by: served.map(|s| exp.nodes[s].clone()),
        hops: served.and_then(|s| flow_hops(exp, f, s)),
        allocation_ms: c
            .allocated_at
            .map(|a| a.saturating_sub(c.requested_at) as f64 / 1e6),
        ..FlowRecord::default()
    }
}

/// The record of a perf client's allocation, from its tests' results as
/// `rina-perf` computes them, aggregated as the real backends aggregate
/// the tool's report.
fn perf_flow_record(
    exp: &Experiment,
    i: usize,
    name: String,
    served: Option<usize>,
    c: &Client,
    p: &perf::PerfClient,
    goodput: &mut Vec<crate::results::GoodputPoint>,
) -> FlowRecord {
    let results: Vec<_> = p.tests.iter().filter_map(|t| t.result()).collect();
    let mut rec = record_head(exp, i, name, served, c);
    crate::backend::real::perf_record(&results, &mut rec, goodput);
    rec.error = if c.allocated_at.is_none() {
        c.error.clone()
    } else if results.len() < p.tests.len() {
        Some(format!(
            "no REPORT for {} of {} tests",
            p.tests.len() - results.len(),
            p.tests.len()
        ))
    } else {
        None
    };
    rec
}

/// Per link and direction, the average rate over the traffic period.
fn link_records(
    exp: &Experiment,
    before: &LinkSnapshot,
    after: &LinkSnapshot,
    out: &mut RunOutput,
) {
    let dur = exp.duration.as_secs_f64().max(1e-9);
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
}

/// Hops between two members on DIF `dif`'s full adjacency graph.
fn dif_hops(exp: &Experiment, dif: usize, from: usize, to: usize) -> Option<u32> {
    let d = &exp.difs[dif];
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn echo_probes_and_replies_count_in_the_offered_bits() {
        // Counted as 0 bits before: echo every 1 ms or 1 ns looked free.
        let t = "nodes = [\"a\", \"b\"]\n[experiment]\nname = \"x\"\nduration = \"10s\"\n\
                 [[link]]\nbetween = [\"a\", \"b\"]\n[[dif]]\nname = \"n\"\nmembers = [\"*\"]\n\
                 over = [\"links\"]\n[[traffic]]\nkind = \"echo\"\ndif = \"n\"\nfrom = [\"a\"]\n\
                 to = \"b\"\nsize = 1000\ninterval = \"1ms\"\n";
        let exp = crate::resolve::load(t, None).unwrap();
        let f = &exp.flows[0];
        let secs = f
            .stop
            .min(exp.duration)
            .saturating_sub(f.start)
            .as_secs_f64();
        assert!(secs > 1.0, "{secs}");
        // 1000 bytes each way every ms: 16 Mbit/s.
        let want = 16e6 * secs;
        let got = offered_bits(&exp).unwrap();
        assert!((got - want).abs() < 1.0, "{got} != {want}");
        // Past the cap, the engine is not picked by itself.
        assert!(eligible(&exp, Some(want / 2.0))
            .unwrap_err()
            .contains("echo"));
    }

    /// A node that wants a timeout every nanosecond.
    struct Busy(Instant);

    impl Node for Busy {
        type Command = ();
        type Event = ();
        fn addrs(&self) -> Vec<SocketAddr> {
            Vec::new()
        }
        fn on_datagram(&mut self, _: &mut Ctx<'_, ()>, _: SocketAddr, _: SocketAddr, _: &[u8]) {}
        fn on_timeout(&mut self, ctx: &mut Ctx<'_, ()>) {
            self.0 = ctx.now() + Duration::from_nanos(1);
        }
        fn on_command(&mut self, _: &mut Ctx<'_, ()>, _: ()) {}
        fn poll_timeout(&self) -> Option<Instant> {
            Some(self.0)
        }
    }

    #[test]
    fn a_stop_is_seen_within_stop_every_events_however_dense() {
        // 50 ms of events every ns is 50 million events: the stop flag was
        // looked at only once per 50 ms of virtual time.
        let mut w = World::new(1);
        let id = w.add_node(Busy(Instant::from_nanos(1)));
        w.rearm(id);
        let looks = Cell::new(0);
        let stopped = || {
            looks.set(looks.get() + 1);
            looks.get() > 1
        };
        let r = run_to(&mut w, Instant::from_nanos(ns(STEP)), &stopped);
        assert!(matches!(r, Err(LabError::Interrupted)), "{r:?}");
        assert_eq!((w.steps(), looks.get()), (STOP_EVERY, 2));
        // Not stopped: it runs to the end.
        let until = Instant::from_nanos(3 * STOP_EVERY + 5);
        run_to(&mut w, until, &|| false).unwrap();
        assert_eq!(w.now(), until);
        assert_eq!(w.steps(), 3 * STOP_EVERY + 5);
    }
}
