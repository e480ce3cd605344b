//! The queueing (PDU-level) engine: every SDU of every flow is cut into
//! PDUs, routed on shortest paths of its DIF's adjacency graph (each
//! adjacency over a lower DIF expanded, recursively, into that DIF's path),
//! and at every link output queued in the unchanged `rina-core` scheduler of
//! the lowest normal DIF running over that link, under the QoS-id its cube
//! maps to at that DIF. Links drain at their rate, add their delay and lose
//! frames with their loss probability. See the module doc of
//! [`super`] for the model's choices.

use super::{mix, LINK_MTU, LINK_OVERHEAD, PCI_BYTES};
use crate::backend::stack;

/// Bytes every frame costs on a link beyond the PDU it carries: the
/// shim-udp's data header and the link's [`LINK_OVERHEAD`] (what the
/// protocol engine's shims pace by).
const FRAME_OVERHEAD: usize = LINK_OVERHEAD + rina_wire::shim_udp::DATA_HEADER_LEN;
use crate::backend::RunCtx;
use crate::model::TrafficKind;
use crate::resolve::{Dest, EventKind, Experiment, Over};
use crate::results::{
    stats_ms, FlowRecord, GoodputPoint, LinkRecord, Reservoir, RunOutput, TimelineEntry,
};
use crate::LabError;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rina_core::rmt::{CuMap, Fifo, PortId, QosId, QueuedPdu, Scheduler, SchedulerConfig};
use rina_core::Instant;
use rina_sim::events::EventQueue;
use rina_tools::tgen::gen::{Generator, Packet as GenPacket, Profile};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::rc::Rc;

/// The one port id every scheduler here serves (one scheduler per port).
const PORT: PortId = 1;
/// Slot index marking the shim's own FIFO (flows directly over a link).
const SHIM: usize = usize::MAX;
/// Virtual time after the end of traffic during which queues drain.
const DRAIN_NS: u64 = 2_000_000_000;
/// Delay samples kept per class for the CDFs.
const RESERVOIR_CAP: usize = 20_000;
/// Bytes a perf sender keeps in flight at most (its "window").
const PERF_WINDOW_BYTES: usize = 256 * 1024;
/// SDUs a perf sender keeps in flight at most.
const PERF_WINDOW_SDUS: usize = 400;
/// Events between two looks at the stop flag and two progress reports.
const CHECK_EVERY: u64 = 1 << 16;

/// One link traversal of a path.
#[derive(Debug, Clone)]
struct Hop {
    /// Output port (link * 2 + direction).
    port: usize,
    /// Scheduler slot of that port (or [`SHIM`]).
    slot: usize,
    /// QoS-id at the scheduling DIF.
    qos: QosId,
    /// Largest PDU payload of each DIF the PDU is in on this hop, from the
    /// flow's DIF down to the scheduling DIF (empty over a bare link shim).
    levels: Vec<usize>,
}

/// A route from one node to another in one DIF, expanded down to links.
#[derive(Debug)]
struct Path {
    hops: Vec<Hop>,
    /// Hops in the flow's own DIF.
    dif_hops: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Data,
    Probe,
    Reply,
}

#[derive(Debug)]
struct Packet {
    path: Rc<Path>,
    hop: usize,
    flow: usize,
    seg: usize,
    kind: Kind,
    /// Emission of the SDU (for a reply: of the probe).
    created: u64,
    /// Multi-fragment SDU id, or `u64::MAX`.
    sdu: u64,
    /// Bytes of this PDU's share of the SDU.
    payload: usize,
    /// Bytes of the whole SDU.
    sdu_bytes: usize,
    /// perf: index of the SDU size.
    size_idx: usize,
    /// Node the packet is going to.
    dst: usize,
    /// Times it was sent again (reliable flows).
    resends: u8,
    buf: Vec<u8>,
}

struct Slot {
    dif: usize,
    sched: Box<dyn Scheduler>,
}

struct Port {
    link: usize,
    slots: Vec<Slot>,
    shim: Option<Box<dyn Scheduler>>,
    rr: usize,
    busy: Option<(usize, Vec<u8>)>,
    wake: Option<u64>,
    bits: u64,
    dropped: u64,
}

#[derive(Debug, Clone, Copy)]
enum Ev {
    Emit(usize),
    TxDone(usize),
    Arrive(usize),
    Wake(usize),
    Echo(usize),
    PerfSize(usize, usize),
    Topo(usize),
    /// A reliable flow's PDU (packet index) goes again from its source.
    Resend(usize),
}

/// Most times a reliable flow's PDU is sent again before it is given up,
/// as EFCP's default gives up after ten retransmissions.
const MAX_RESENDS: u8 = 10;
/// The least time before a lost PDU goes again (EFCP's least RTO).
const MIN_RTO_NS: u64 = 1_000_000;

/// One record: a flow, or a flow allocated again after its destination moved.
struct Seg {
    flow: usize,
    name: String,
    served_by: Option<usize>,
    hops: Option<u32>,
    sent: u64,
    received: u64,
    bytes_rx: u64,
    bytes_tx: u64,
    delays: Vec<f64>,
    rtts: Vec<f64>,
    no_route: bool,
}

struct FlowState {
    seg: usize,
    segs: u32,
    gen: Option<Generator>,
    pending: Option<GenPacket>,
    /// tgen: offset of the schedule from the flow's start.
    phase: u64,
    /// perf: current size index, window, in flight, end of the size's period.
    size_idx: usize,
    window: usize,
    inflight: usize,
    period_end: u64,
    filling: bool,
    sync_drop: bool,
}

/// What a perf receiver timed of one size: its rate is what arrived after
/// the first SDU over the time from the first arrival to the last, as
/// `rina-perf`'s receiver times it (SDUs still queued from the size
/// before arrive first and are not counted; the queue's drain after the
/// size's period is).
#[derive(Debug, Default, Clone, Copy)]
struct Received {
    first_ns: Option<u64>,
    last_ns: u64,
    /// Bits of the SDUs after the first.
    timed_bits: u64,
}

impl Received {
    fn arrived(&mut self, now: u64, bits: u64) {
        match self.first_ns {
            None => self.first_ns = Some(now),
            Some(_) => self.timed_bits += bits,
        }
        self.last_ns = now;
    }

    fn rate_bps(&self) -> f64 {
        let span = self
            .last_ns
            .saturating_sub(self.first_ns.unwrap_or(self.last_ns));
        if span == 0 {
            return 0.0;
        }
        self.timed_bits as f64 * 1e9 / span as f64
    }
}

struct Multi {
    remaining: u32,
    dead: bool,
}

type Tree = Rc<Vec<Option<(usize, usize)>>>;

/// The engine's state.
pub(super) struct Engine<'a> {
    exp: &'a Experiment,
    now: u64,
    end: u64,
    ev: EventQueue<Ev>,
    ports: Vec<Port>,
    link_up: Vec<bool>,
    node_up: Vec<bool>,
    link_rng: Vec<ChaCha8Rng>,
    app_at: Vec<usize>,
    /// BFS trees per (DIF, source): (previous node, adjacency index).
    trees: HashMap<(usize, usize), Tree>,
    paths: HashMap<(usize, QosId, usize, usize), Option<Rc<Path>>>,
    packets: Vec<Option<Packet>>,
    free: Vec<usize>,
    multi: HashMap<u64, Multi>,
    next_sdu: u64,
    flows: Vec<FlowState>,
    /// Per flow: its cube retransmits (a reliable cube, not over a shim).
    reliable: Vec<bool>,
    /// PDUs sent again.
    pub(super) resent: u64,
    segs: Vec<Seg>,
    reservoir: Reservoir,
    goodput: BTreeMap<(usize, usize), Received>,
    timeline: Vec<TimelineEntry>,
    /// Events processed.
    pub(super) steps: u64,
}

/// The most SDU bytes one PDU of DIF `dif` carries: its largest PDU as
/// every backend configures it ([`stack::max_pdu`], over shims of
/// [`LINK_MTU`]) less the PCI.
fn max_payload(exp: &Experiment, dif: usize) -> usize {
    let mp = stack::max_pdu(exp, dif, &|_| LINK_MTU).unwrap_or(rina_core::normal::DEFAULT_MAX_PDU)
        as usize;
    mp.saturating_sub(PCI_BYTES).max(1)
}

/// Bytes on the wire for a PDU carrying `payload` bytes of its flow's DIF
/// over a hop whose DIFs allow `levels` bytes of payload each: a lower DIF
/// cuts what does not fit into fragments (each with its PCI), and every
/// frame pays the link overhead.
fn wire_bytes(payload: usize, levels: &[usize]) -> usize {
    // Fast path: nothing is fragmented below the flow's DIF.
    let mut s = payload;
    let mut fits = true;
    for (i, &mp) in levels.iter().enumerate() {
        if i > 0 && s > mp {
            fits = false;
            break;
        }
        s += PCI_BYTES;
    }
    if fits {
        return s + FRAME_OVERHEAD;
    }
    let mut sizes = vec![payload + PCI_BYTES];
    for &mp in &levels[1..] {
        let mut next = Vec::with_capacity(sizes.len() * 2);
        for &x in &sizes {
            let mut left = x;
            while left > 0 {
                let c = left.min(mp);
                next.push(c + PCI_BYTES);
                left -= c;
            }
        }
        sizes = next;
    }
    sizes.iter().sum::<usize>() + sizes.len() * FRAME_OVERHEAD
}

/// Span of the random start phase of a tgen flow: one packet gap.
fn phase_span_ns(p: &Profile) -> u64 {
    let gap_s = match *p {
        Profile::Voice { interval_s, .. } => interval_s,
        Profile::Cbr { rate_bps, size }
        | Profile::Poisson { rate_bps, size }
        | Profile::OnOff { rate_bps, size, .. } => size as f64 * 8.0 / rate_bps,
        Profile::Varying { max_bps, size, .. } => size as f64 * 8.0 / max_bps,
    };
    (gap_s.clamp(0.0, 1.0) * 1e9) as u64
}

fn tx_ns(bytes: usize, rate_bps: f64) -> u64 {
    let ns = (bytes as f64 * 8.0 * 1e9 / rate_bps.max(1.0)).ceil();
    (ns as u64).max(1)
}

fn ns(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl<'a> Engine<'a> {
    /// Builds the ports and schedulers of `exp`.
    pub(super) fn new(exp: &'a Experiment) -> Result<Self, LabError> {
        let mut ports: Vec<Port> = Vec::with_capacity(exp.links.len() * 2);
        for (li, l) in exp.links.iter().enumerate() {
            for dir in 0..2 {
                let mut slots = Vec::new();
                for (di, d) in exp.difs.iter().enumerate() {
                    if !d.adjacencies.iter().any(|a| a.over == Over::Link(li)) {
                        continue;
                    }
                    let mut cu = CuMap::new();
                    for c in &d.cubes {
                        cu = cu.with(c.id, c.urgency, c.cherish);
                    }
                    let mut cfg = d.scheduler.clone();
                    if let SchedulerConfig::QtaMux(q) = &mut cfg {
                        q.seed = mix(exp.seed, (((li * 2 + dir) as u64) << 16) | di as u64);
                    }
                    let mut sched = cfg.build(&cu).map_err(|e| LabError::Backend {
                        backend: "sim",
                        what: format!("DIF `{}`: {e}", d.name),
                    })?;
                    sched.create_queues(PORT);
                    slots.push(Slot { dif: di, sched });
                }
                let shim_needed = exp.flows.iter().any(|f| f.shim == Some(li));
                let shim = shim_needed.then(|| {
                    let mut s: Box<dyn Scheduler> = Box::new(Fifo::new(l.queue));
                    s.create_queues(PORT);
                    s
                });
                ports.push(Port {
                    link: li,
                    slots,
                    shim,
                    rr: 0,
                    busy: None,
                    wake: None,
                    bits: 0,
                    dropped: 0,
                });
            }
        }
        let link_rng = (0..exp.links.len())
            .map(|i| ChaCha8Rng::seed_from_u64(mix(exp.seed, 0x1000 + i as u64)))
            .collect();
        Ok(Engine {
            exp,
            now: 0,
            end: ns(exp.duration),
            ev: EventQueue::new(),
            ports,
            link_up: vec![true; exp.links.len()],
            node_up: vec![true; exp.nodes.len()],
            link_rng,
            app_at: exp.apps.iter().map(|a| a.node).collect(),
            trees: HashMap::new(),
            paths: HashMap::new(),
            packets: Vec::new(),
            free: Vec::new(),
            multi: HashMap::new(),
            next_sdu: 0,
            flows: Vec::new(),
            reliable: exp
                .flows
                .iter()
                .map(|f| {
                    f.shim.is_none()
                        && exp.difs[f.dif]
                            .cubes
                            .iter()
                            .any(|c| c.id == f.cube && c.reliable)
                })
                .collect(),
            resent: 0,
            segs: Vec::new(),
            reservoir: Reservoir::new(RESERVOIR_CAP, exp.seed),
            goodput: BTreeMap::new(),
            timeline: Vec::new(),
            steps: 0,
        })
    }

    fn note(&mut self, what: String) {
        self.timeline.push(TimelineEntry {
            t_s: self.now as f64 / 1e9,
            what,
        });
    }

    fn link_ok(&self, l: usize) -> bool {
        let link = &self.exp.links[l];
        self.link_up[l] && self.node_up[link.a] && self.node_up[link.b]
    }

    fn dest_now(&self, d: Dest) -> usize {
        match d {
            Dest::Node(n) => n,
            Dest::App(a) => self.app_at[a],
        }
    }

    // ---------------------------------------------------------------- routes

    /// Whether adjacency `ai` of DIF `dif` can carry PDUs now.
    fn adj_up(&mut self, dif: usize, ai: usize) -> bool {
        let a = self.exp.difs[dif].adjacencies[ai];
        if !self.node_up[a.a] || !self.node_up[a.b] {
            return false;
        }
        match a.over {
            Over::Link(l) => self.link_ok(l),
            Over::Dif(lower) => self.tree(lower, a.a)[a.b].is_some(),
        }
    }

    /// Breadth-first tree of DIF `dif` from `src` over the adjacencies up now
    /// (neighbours in the order the adjacencies are listed).
    fn tree(&mut self, dif: usize, src: usize) -> Tree {
        if let Some(t) = self.trees.get(&(dif, src)) {
            return t.clone();
        }
        let exp = self.exp;
        let d = &exp.difs[dif];
        let up: Vec<bool> = (0..d.adjacencies.len())
            .map(|ai| self.adj_up(dif, ai))
            .collect();
        let mut prev: Vec<Option<(usize, usize)>> = vec![None; exp.nodes.len()];
        let mut seen = vec![false; exp.nodes.len()];
        seen[src] = true;
        let mut q = VecDeque::from([src]);
        while let Some(x) = q.pop_front() {
            for (ai, a) in d.adjacencies.iter().enumerate() {
                if !up[ai] {
                    continue;
                }
                let y = if a.a == x {
                    a.b
                } else if a.b == x {
                    a.a
                } else {
                    continue;
                };
                if !seen[y] {
                    seen[y] = true;
                    prev[y] = Some((x, ai));
                    q.push_back(y);
                }
            }
        }
        let t = Rc::new(prev);
        self.trees.insert((dif, src), t.clone());
        t
    }

    /// The path of a flow of DIF `dif` (or over link shim `shim`) with
    /// QoS-id `qos` from `from` to `to`, if there is one now.
    fn path(
        &mut self,
        dif: usize,
        shim: Option<usize>,
        qos: QosId,
        from: usize,
        to: usize,
    ) -> Option<Rc<Path>> {
        let key = (shim.map_or(dif, |l| usize::MAX - l), qos, from, to);
        if let Some(p) = self.paths.get(&key) {
            return p.clone();
        }
        let p = match shim {
            Some(l) => {
                let link = &self.exp.links[l];
                if !self.link_ok(l) {
                    None
                } else {
                    let dir = usize::from(link.a != from);
                    Some(Path {
                        hops: vec![Hop {
                            port: l * 2 + dir,
                            slot: SHIM,
                            qos: 0,
                            levels: Vec::new(),
                        }],
                        dif_hops: 1,
                    })
                }
            }
            None => {
                let mut hops = Vec::new();
                self.expand(dif, qos, from, to, &mut Vec::new(), &mut hops)
                    .map(|dif_hops| Path { hops, dif_hops })
            }
        }
        .map(Rc::new);
        self.paths.insert(key, p.clone());
        p
    }

    /// Appends the link hops from `from` to `to` in DIF `dif` to `out`;
    /// returns the number of hops in `dif`, or None if unreachable.
    fn expand(
        &mut self,
        dif: usize,
        qos: QosId,
        from: usize,
        to: usize,
        stack: &mut Vec<usize>,
        out: &mut Vec<Hop>,
    ) -> Option<u32> {
        if from == to {
            return Some(0);
        }
        let t = self.tree(dif, from);
        let mut seq = Vec::new();
        let mut x = to;
        while x != from {
            let (p, ai) = t[x]?;
            seq.push((p, x, ai));
            x = p;
        }
        seq.reverse();
        let exp = self.exp;
        let d = &exp.difs[dif];
        stack.push(max_payload(exp, dif));
        for &(a, b, ai) in &seq {
            match d.adjacencies[ai].over {
                Over::Link(l) => {
                    let link = &exp.links[l];
                    let dir = usize::from(link.a != a);
                    let port = l * 2 + dir;
                    let slot = self.ports[port]
                        .slots
                        .iter()
                        .position(|s| s.dif == dif)
                        .unwrap_or(SHIM);
                    out.push(Hop {
                        port,
                        slot,
                        qos,
                        levels: stack.clone(),
                    });
                }
                Over::Dif(lower) => {
                    let lq = d
                        .cube(qos)
                        .and_then(|c| c.maps_to.get(&lower).copied())
                        .unwrap_or(exp.difs[lower].cubes[0].id);
                    if self.expand(lower, lq, a, b, stack, out).is_none() {
                        stack.pop();
                        return None;
                    }
                }
            }
        }
        stack.pop();
        Some(seq.len() as u32)
    }

    fn topology_changed(&mut self) {
        self.trees.clear();
        self.paths.clear();
    }

    // --------------------------------------------------------------- packets

    fn alloc(&mut self, p: Packet) -> usize {
        match self.free.pop() {
            Some(i) => {
                self.packets[i] = Some(p);
                i
            }
            None => {
                self.packets.push(Some(p));
                self.packets.len() - 1
            }
        }
    }

    /// Emits one SDU of `bytes` on flow `f`, fragmented at the flow's DIF;
    /// returns whether it could be routed.
    #[allow(clippy::too_many_arguments)]
    fn send_sdu(
        &mut self,
        f: usize,
        kind: Kind,
        created: u64,
        bytes: usize,
        from: usize,
        to: usize,
        size_idx: usize,
    ) -> bool {
        let exp = self.exp;
        let fl = &exp.flows[f];
        let seg = self.flows[f].seg;
        if kind != Kind::Reply {
            self.segs[seg].sent += 1;
            self.segs[seg].bytes_tx += bytes as u64;
        }
        if !self.node_up[from] {
            return false;
        }
        let Some(path) = self.path(fl.dif, fl.shim, fl.cube, from, to) else {
            if !self.segs[seg].no_route {
                self.segs[seg].no_route = true;
                let name = self.segs[seg].name.clone();
                self.note(format!(
                    "{name}: no route from {} to {}",
                    exp.nodes[from], exp.nodes[to]
                ));
            }
            return false;
        };
        if kind != Kind::Reply && self.segs[seg].hops.is_none() {
            self.segs[seg].hops = Some(path.dif_hops);
        }
        if path.hops.is_empty() {
            // Same node: delivered at once.
            self.delivered(f, seg, kind, created, bytes, size_idx, to);
            return true;
        }
        let mp = match fl.shim {
            Some(_) => LINK_MTU,
            None => max_payload(exp, fl.dif),
        };
        let frags = bytes.div_ceil(mp).max(1);
        let sdu = if frags > 1 {
            let id = self.next_sdu;
            self.next_sdu += 1;
            self.multi.insert(
                id,
                Multi {
                    remaining: frags as u32,
                    dead: false,
                },
            );
            id
        } else {
            u64::MAX
        };
        let mut left = bytes;
        for _ in 0..frags {
            let payload = left.min(mp).max(1);
            left = left.saturating_sub(mp);
            let idx = self.alloc(Packet {
                path: path.clone(),
                hop: 0,
                flow: f,
                seg,
                kind,
                created,
                sdu,
                payload,
                sdu_bytes: bytes,
                size_idx,
                dst: to,
                resends: 0,
                buf: Vec::new(),
            });
            self.enqueue(idx);
        }
        true
    }

    /// Queues packet `idx` at the output of its current hop.
    fn enqueue(&mut self, idx: usize) {
        let Some(p) = self.packets[idx].as_ref() else {
            return;
        };
        let hop = &p.path.hops[p.hop];
        let (port, slot, qos) = (hop.port, hop.slot, hop.qos);
        let wire = wire_bytes(p.payload, &hop.levels);
        if !self.link_ok(self.ports[port].link) {
            self.ports[port].dropped += 1;
            self.lost(idx);
            return;
        }
        let Some(p) = self.packets[idx].as_mut() else {
            return;
        };
        let mut buf = std::mem::take(&mut p.buf);
        buf.clear();
        buf.resize(wire.max(8), 0);
        buf[..8].copy_from_slice(&(idx as u64).to_le_bytes());
        let pdu = QueuedPdu {
            qos_id: qos,
            mgmt: false,
            bytes: buf.into(),
        };
        let now = Instant::from_nanos(self.now);
        let pt = &mut self.ports[port];
        let sched = match slot {
            SHIM => pt.shim.as_mut(),
            s => pt.slots.get_mut(s).map(|s| &mut s.sched),
        };
        let res = match sched {
            Some(s) => s.enqueue(now, PORT, pdu),
            None => Err(pdu),
        };
        match res {
            Ok(()) => self.try_send(port),
            Err(back) => {
                self.ports[port].dropped += 1;
                if let Some(p) = self.packets[idx].as_mut() {
                    p.buf = back.bytes.into_vec();
                }
                self.lost(idx);
            }
        }
    }

    fn try_send(&mut self, port: usize) {
        let now_i = Instant::from_nanos(self.now);
        let link = self.ports[port].link;
        if self.ports[port].busy.is_some() || !self.link_ok(link) {
            return;
        }
        let pt = &mut self.ports[port];
        let n = pt.slots.len() + usize::from(pt.shim.is_some());
        let mut got = None;
        for k in 0..n {
            let i = (pt.rr + k) % n;
            let s = if i < pt.slots.len() {
                &mut pt.slots[i].sched
            } else if let Some(s) = pt.shim.as_mut() {
                s
            } else {
                continue;
            };
            if let Some(pdu) = s.next_to_send(now_i, PORT) {
                pt.rr = (i + 1) % n;
                got = Some(pdu);
                break;
            }
        }
        match got {
            Some(pdu) => {
                let mut id = [0u8; 8];
                id.copy_from_slice(&pdu.bytes[..8]);
                let idx = u64::from_le_bytes(id) as usize;
                let t = tx_ns(pdu.bytes.len(), self.exp.links[link].rate_bps);
                let pt = &mut self.ports[port];
                if self.now + t <= self.end {
                    pt.bits += pdu.bytes.len() as u64 * 8;
                } else if self.now < self.end {
                    let share = (self.end - self.now) as f64 / t as f64;
                    pt.bits += (pdu.bytes.len() as f64 * 8.0 * share) as u64;
                }
                pt.busy = Some((idx, pdu.bytes.into_vec()));
                self.ev
                    .push(Instant::from_nanos(self.now + t), Ev::TxDone(port));
            }
            None => {
                let pt = &self.ports[port];
                let w = pt
                    .slots
                    .iter()
                    .map(|s| &s.sched)
                    .chain(pt.shim.iter())
                    .filter(|s| s.has_queued(PORT))
                    .filter_map(|s| s.next_wakeup(PORT))
                    .min();
                if let Some(w) = w {
                    let w = w.as_nanos().max(self.now + 1);
                    if pt.wake.is_none_or(|x| w < x || x <= self.now) {
                        self.ports[port].wake = Some(w);
                        self.ev.push(Instant::from_nanos(w), Ev::Wake(port));
                    }
                }
            }
        }
    }

    fn tx_done(&mut self, port: usize) {
        let Some((idx, bytes)) = self.ports[port].busy.take() else {
            return;
        };
        let link = self.ports[port].link;
        if let Some(p) = self.packets[idx].as_mut() {
            p.buf = bytes;
        }
        let l = &self.exp.links[link];
        let lost = !self.link_ok(link)
            || (l.loss > 0.0 && self.link_rng[link].gen_bool(l.loss.clamp(0.0, 1.0)));
        if lost {
            self.ports[port].dropped += 1;
            self.lost(idx);
        } else {
            self.ev
                .push(Instant::from_nanos(self.now + ns(l.delay)), Ev::Arrive(idx));
        }
        self.try_send(port);
    }

    fn arrive(&mut self, idx: usize) {
        let Some(p) = self.packets[idx].as_ref() else {
            return;
        };
        let link = self.ports[p.path.hops[p.hop].port].link;
        if !self.link_ok(link) {
            self.lost(idx);
            return;
        }
        let Some(p) = self.packets[idx].as_mut() else {
            return;
        };
        p.hop += 1;
        if p.hop < p.path.hops.len() {
            self.enqueue(idx);
            return;
        }
        let Some(p) = self.packets[idx].take() else {
            return;
        };
        self.free.push(idx);
        if p.sdu != u64::MAX {
            let Some(m) = self.multi.get_mut(&p.sdu) else {
                return;
            };
            m.remaining -= 1;
            if m.remaining > 0 {
                return;
            }
            let dead = m.dead;
            self.multi.remove(&p.sdu);
            if dead {
                self.sdu_lost(p.flow, p.kind);
                return;
            }
        }
        self.delivered(
            p.flow,
            p.seg,
            p.kind,
            p.created,
            p.sdu_bytes,
            p.size_idx,
            p.dst,
        );
    }

    /// An SDU reached node `at` (all its fragments).
    #[allow(clippy::too_many_arguments)]
    fn delivered(
        &mut self,
        f: usize,
        seg: usize,
        kind: Kind,
        created: u64,
        bytes: usize,
        size_idx: usize,
        at: usize,
    ) {
        let exp = self.exp;
        let fl = &exp.flows[f];
        // The destination must still be there.
        let here = match (kind, fl.to) {
            (Kind::Reply, _) => true,
            (_, Dest::Node(n)) => n == at,
            (_, Dest::App(a)) => self.app_at[a] == at && self.node_up[at],
        };
        if !here {
            self.sdu_lost(f, kind);
            return;
        }
        let delay_ms = (self.now - created) as f64 / 1e6;
        match kind {
            Kind::Probe => {
                // The echo server writes it back.
                self.send_sdu(f, Kind::Reply, created, bytes, at, fl.from, 0);
            }
            Kind::Reply => {
                let s = &mut self.segs[seg];
                s.received += 1;
                s.bytes_rx += bytes as u64;
                s.rtts.push(delay_ms);
                s.delays.push(delay_ms / 2.0);
                self.reservoir.offer(&fl.class, delay_ms / 2.0);
            }
            Kind::Data => {
                let s = &mut self.segs[seg];
                s.received += 1;
                s.bytes_rx += bytes as u64;
                s.delays.push(delay_ms);
                self.reservoir.offer(&fl.class, delay_ms);
                if fl.kind == TrafficKind::Perf {
                    let now = self.now;
                    self.goodput
                        .entry((f, size_idx))
                        .or_default()
                        .arrived(now, bytes as u64 * 8);
                    self.perf_done(f);
                }
            }
        }
    }

    fn lost(&mut self, idx: usize) {
        if self.resend_later(idx) {
            return;
        }
        let Some(p) = self.packets[idx].take() else {
            return;
        };
        self.free.push(idx);
        if p.sdu != u64::MAX {
            let Some(m) = self.multi.get_mut(&p.sdu) else {
                return;
            };
            m.dead = true;
            m.remaining -= 1;
            if m.remaining > 0 {
                return;
            }
            self.multi.remove(&p.sdu);
        }
        self.sdu_lost(p.flow, p.kind);
    }

    /// A PDU of a flow in a reliable cube that was lost goes again from
    /// its source, as EFCP would send it again: after twice the path's
    /// propagation delay (at least [`MIN_RTO_NS`]), doubling each time,
    /// at most [`MAX_RESENDS`] times. True if it will.
    fn resend_later(&mut self, idx: usize) -> bool {
        let Some(p) = self.packets[idx].as_mut() else {
            return false;
        };
        if !self.reliable[p.flow] || p.resends >= MAX_RESENDS {
            return false;
        }
        let prop: u64 = p
            .path
            .hops
            .iter()
            .map(|h| ns(self.exp.links[self.ports[h.port].link].delay))
            .sum();
        let rto = (2 * prop).max(MIN_RTO_NS) << p.resends;
        p.resends += 1;
        self.resent += 1;
        self.ev
            .push(Instant::from_nanos(self.now + rto), Ev::Resend(idx));
        true
    }

    /// Sends reliable PDU `idx` again from its first hop.
    fn resend(&mut self, idx: usize) {
        let Some(p) = self.packets[idx].as_mut() else {
            return;
        };
        p.hop = 0;
        self.enqueue(idx);
    }

    fn sdu_lost(&mut self, f: usize, kind: Kind) {
        if self.exp.flows[f].kind == TrafficKind::Perf && kind == Kind::Data {
            self.perf_done(f);
        }
    }

    // --------------------------------------------------------------- traffic

    fn perf_done(&mut self, f: usize) {
        let st = &mut self.flows[f];
        st.inflight = st.inflight.saturating_sub(1);
        if st.filling {
            // Dropped while being sent: wait for the next delivery.
            st.sync_drop = true;
            return;
        }
        self.perf_fill(f);
    }

    fn perf_fill(&mut self, f: usize) {
        let fl = &self.exp.flows[f];
        let stop = ns(fl.stop);
        self.flows[f].filling = true;
        self.flows[f].sync_drop = false;
        loop {
            let st = &self.flows[f];
            if st.sync_drop
                || self.now >= st.period_end
                || self.now >= stop
                || st.inflight >= st.window
            {
                break;
            }
            let size = fl.sdu_sizes[st.size_idx];
            let si = st.size_idx;
            self.flows[f].inflight += 1;
            let to = self.dest_now(fl.to);
            if !self.send_sdu(f, Kind::Data, self.now, size, fl.from, to, si) {
                // Unroutable: try again at the next size.
                self.flows[f].inflight -= 1;
                break;
            }
        }
        self.flows[f].filling = false;
    }

    fn new_seg(&mut self, f: usize) {
        let fl = &self.exp.flows[f];
        let served_by = Some(self.dest_now(fl.to));
        let st = &mut self.flows[f];
        st.segs += 1;
        let name = if st.segs == 1 {
            fl.id.clone()
        } else {
            format!("{}#{}", fl.id, st.segs)
        };
        st.seg = self.segs.len();
        self.segs.push(Seg {
            flow: f,
            name,
            served_by,
            hops: None,
            sent: 0,
            received: 0,
            bytes_rx: 0,
            bytes_tx: 0,
            delays: Vec::new(),
            rtts: Vec::new(),
            no_route: false,
        });
    }

    fn setup_traffic(&mut self) {
        let exp = self.exp;
        for (f, fl) in exp.flows.iter().enumerate() {
            let start = ns(fl.start);
            self.flows.push(FlowState {
                seg: 0,
                segs: 0,
                gen: None,
                pending: None,
                phase: 0,
                size_idx: 0,
                window: 1,
                inflight: 0,
                period_end: 0,
                filling: false,
                sync_drop: false,
            });
            self.new_seg(f);
            match fl.kind {
                TrafficKind::Tgen => {
                    let Some(prof) = fl.profile.clone() else {
                        continue;
                    };
                    // Flows do not start in lockstep: a random phase within
                    // one packet gap of the profile.
                    let span = phase_span_ns(&prof).max(1);
                    let mut rng = ChaCha8Rng::seed_from_u64(mix(exp.seed, 0x2000 + f as u64));
                    let phase = rng.gen_range(0..span);
                    let mut g = Generator::new(prof, mix(exp.seed, f as u64));
                    let first = g.next();
                    if let Some(p) = first {
                        let t = start.saturating_add(phase).saturating_add(p.at_ns);
                        if t < ns(fl.stop) {
                            self.ev.push(Instant::from_nanos(t), Ev::Emit(f));
                        }
                    }
                    let st = &mut self.flows[f];
                    st.gen = Some(g);
                    st.pending = first;
                    st.phase = phase;
                }
                TrafficKind::Echo => {
                    self.ev.push(Instant::from_nanos(start), Ev::Echo(f));
                }
                TrafficKind::Perf => {
                    self.ev.push(Instant::from_nanos(start), Ev::PerfSize(f, 0));
                }
            }
        }
        for (i, e) in exp.events.iter().enumerate() {
            self.ev.push(Instant::from_nanos(ns(e.at)), Ev::Topo(i));
        }
    }

    fn emit(&mut self, f: usize) {
        let fl = &self.exp.flows[f];
        let start = ns(fl.start).saturating_add(self.flows[f].phase);
        let stop = ns(fl.stop);
        let Some(pk) = self.flows[f].pending.take() else {
            return;
        };
        let next = self.flows[f].gen.as_mut().and_then(|g| g.next());
        self.flows[f].pending = next;
        let to = self.dest_now(fl.to);
        self.send_sdu(f, Kind::Data, self.now, pk.size, fl.from, to, 0);
        if let Some(p) = next {
            let t = start.saturating_add(p.at_ns);
            if t < stop && t < self.end {
                self.ev
                    .push(Instant::from_nanos(t.max(self.now)), Ev::Emit(f));
            }
        }
    }

    fn echo(&mut self, f: usize) {
        let fl = &self.exp.flows[f];
        let to = self.dest_now(fl.to);
        self.send_sdu(f, Kind::Probe, self.now, fl.size.max(1), fl.from, to, 0);
        let t = self.now + ns(fl.interval).max(1);
        if t < ns(fl.stop) && t < self.end {
            self.ev.push(Instant::from_nanos(t), Ev::Echo(f));
        }
    }

    fn perf_size(&mut self, f: usize, k: usize) {
        let fl = &self.exp.flows[f];
        if k >= fl.sdu_sizes.len() {
            return;
        }
        let per = ns(fl.per_size).max(1);
        let size = fl.sdu_sizes[k];
        let st = &mut self.flows[f];
        st.size_idx = k;
        st.period_end = (self.now + per).min(ns(fl.stop));
        st.window = (PERF_WINDOW_BYTES / size.max(1)).clamp(2, PERF_WINDOW_SDUS);
        self.goodput.entry((f, k)).or_default();
        self.perf_fill(f);
        let t = self.now + per;
        if t < ns(fl.stop) {
            self.ev.push(Instant::from_nanos(t), Ev::PerfSize(f, k + 1));
        }
    }

    /// Drops everything waiting at `port` (its link went down).
    fn flush_port(&mut self, port: usize) {
        let now = Instant::from_nanos(self.now);
        let mut out = Vec::new();
        let mut rest = 0;
        let pt = &mut self.ports[port];
        for s in pt
            .slots
            .iter_mut()
            .map(|s| &mut s.sched)
            .chain(pt.shim.iter_mut())
        {
            while let Some(pdu) = s.next_to_send(now, PORT) {
                out.push(pdu);
            }
            // What a shaper holds back is discarded unseen.
            rest += s.destroy_queues(PORT);
            s.create_queues(PORT);
        }
        pt.wake = None;
        pt.dropped += (out.len() + rest) as u64;
        for pdu in out {
            let mut id = [0u8; 8];
            id.copy_from_slice(&pdu.bytes[..8]);
            self.lost(u64::from_le_bytes(id) as usize);
        }
        if rest > 0 {
            // Perf senders lose track of what was discarded: let them refill.
            for st in &mut self.flows {
                st.inflight = 0;
            }
        }
    }

    fn topo(&mut self, i: usize) {
        let exp = self.exp;
        let e = &exp.events[i];
        match e.what {
            EventKind::LinkDown(l) => {
                self.link_up[l] = false;
                self.flush_port(l * 2);
                self.flush_port(l * 2 + 1);
                self.note(format!("link {} down", exp.links[l].name));
            }
            EventKind::LinkUp(l) => {
                self.link_up[l] = true;
                self.note(format!("link {} up", exp.links[l].name));
            }
            EventKind::NodeStop(n) => {
                self.node_up[n] = false;
                for (l, link) in exp.links.iter().enumerate() {
                    if link.a == n || link.b == n {
                        self.flush_port(l * 2);
                        self.flush_port(l * 2 + 1);
                    }
                }
                self.note(format!("node {} stops", exp.nodes[n]));
            }
            EventKind::NodeStart(n) => {
                self.node_up[n] = true;
                self.note(format!("node {} starts", exp.nodes[n]));
            }
            EventKind::AppMove { app, to } => {
                let from = self.app_at[app];
                self.app_at[app] = to;
                self.note(format!(
                    "application {} moves from {} to {}",
                    exp.apps[app].name, exp.nodes[from], exp.nodes[to]
                ));
                for f in 0..exp.flows.len() {
                    let fl = &exp.flows[f];
                    if fl.to == Dest::App(app) && ns(fl.stop) > self.now {
                        self.new_seg(f);
                        let name = self.segs[self.flows[f].seg].name.clone();
                        self.note(format!(
                            "{name}: allocated again to {}, now at {}",
                            exp.apps[app].name, exp.nodes[to]
                        ));
                    }
                }
            }
        }
        self.topology_changed();
        for p in 0..self.ports.len() {
            self.try_send(p);
        }
    }

    /// Runs to the end of traffic plus the drain time.
    pub(super) fn run(&mut self, ctx: &RunCtx<'_>) -> Result<(), LabError> {
        self.setup_traffic();
        let limit = self.end.saturating_add(DRAIN_NS);
        let mut next_report = 0;
        while let Some((at, ev)) = self.ev.pop() {
            let t = at.as_nanos();
            if t > limit {
                break;
            }
            self.now = t;
            self.steps += 1;
            if self.steps.is_multiple_of(CHECK_EVERY) || t >= next_report {
                next_report = t + (self.end / 100).max(1);
                if ctx.stopped() {
                    return Err(LabError::Interrupted);
                }
                let frac = (t as f64 / self.end.max(1) as f64).min(1.0);
                (ctx.progress)(frac, "simulating (queueing engine)");
            }
            match ev {
                Ev::Emit(f) => self.emit(f),
                Ev::Resend(i) => self.resend(i),
                Ev::TxDone(p) => self.tx_done(p),
                Ev::Arrive(i) => self.arrive(i),
                Ev::Wake(p) => {
                    if self.ports[p].wake == Some(t) {
                        self.ports[p].wake = None;
                        self.try_send(p);
                    }
                }
                Ev::Echo(f) => self.echo(f),
                Ev::PerfSize(f, k) => self.perf_size(f, k),
                Ev::Topo(i) => self.topo(i),
            }
        }
        if ctx.stopped() {
            return Err(LabError::Interrupted);
        }
        (ctx.progress)(1.0, "simulated (queueing engine)");
        Ok(())
    }

    /// What the run measured.
    pub(super) fn output(self, out: &mut RunOutput) {
        let exp = self.exp;
        let dur = exp.duration.as_secs_f64().max(1e-9);
        for mut s in self.segs {
            let fl = &exp.flows[s.flow];
            let stats = stats_ms(&mut s.delays);
            let active = fl.stop.saturating_sub(fl.start).as_secs_f64().max(1e-9);
            let rtt =
                (!s.rtts.is_empty()).then(|| s.rtts.iter().sum::<f64>() / s.rtts.len() as f64);
            let (dif, cube) = match fl.shim {
                Some(_) => ("links".to_string(), "-".to_string()),
                None => {
                    let d = &exp.difs[fl.dif];
                    (
                        d.name.clone(),
                        d.cube(fl.cube).map_or("-".into(), |c| c.name.clone()),
                    )
                }
            };
            out.flows.push(FlowRecord {
                flow: s.name,
                kind: match fl.kind {
                    TrafficKind::Tgen => "tgen",
                    TrafficKind::Echo => "echo",
                    TrafficKind::Perf => "perf",
                }
                .into(),
                class: fl.class.clone(),
                dif,
                cube,
                src: exp.nodes[fl.from].clone(),
                dst: match fl.to {
                    Dest::Node(n) => exp.nodes[n].clone(),
                    Dest::App(a) => exp.apps[a].name.clone(),
                },
                served_by: s.served_by.map(|n| exp.nodes[n].clone()),
                hops: s.hops,
                sdu_bytes: if s.sent == 0 {
                    0.0
                } else {
                    s.bytes_tx as f64 / s.sent as f64
                },
                sent: s.sent,
                received: s.received,
                loss_pct: if s.sent == 0 {
                    0.0
                } else {
                    100.0 * s.sent.saturating_sub(s.received) as f64 / s.sent as f64
                },
                delay_min_ms: stats.map(|x| x.0),
                delay_avg_ms: stats.map(|x| x.1),
                delay_p99_ms: stats.map(|x| x.2),
                delay_max_ms: stats.map(|x| x.3),
                rtt_avg_ms: rtt,
                goodput_bps: s.bytes_rx as f64 * 8.0 / active,
                allocation_ms: None,
                error: s
                    .no_route
                    .then(|| "no route to the destination".to_string()),
            });
        }
        out.samples = self.reservoir.into_samples();
        for ((f, k), rx) in self.goodput {
            let fl = &exp.flows[f];
            out.goodput.push(GoodputPoint {
                series: fl.class.clone(),
                sdu_bytes: fl.sdu_sizes[k],
                goodput_bps: rx.rate_bps(),
            });
        }
        for (l, link) in exp.links.iter().enumerate() {
            let (ab, ba) = (&self.ports[l * 2], &self.ports[l * 2 + 1]);
            out.links.push(LinkRecord {
                link: link.name.clone(),
                rate_bps: link.rate_bps,
                avg_bps_ab: ab.bits as f64 / dur,
                avg_bps_ba: ba.bits as f64 / dur,
                dropped: ab.dropped + ba.dropped,
            });
        }
        out.timeline.extend(self.timeline);
        if self.resent > 0 {
            out.timeline.push(TimelineEntry {
                t_s: dur,
                what: format!(
                    "queueing model: {} PDUs of flows in reliable cubes sent again",
                    self.resent
                ),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_bytes_adds_a_pci_per_dif_and_fragments_below() {
        let (p, f) = (PCI_BYTES, FRAME_OVERHEAD);
        // One DIF over a link: payload + PCI + frame overhead.
        assert_eq!(wire_bytes(1000, &[1441]), 1000 + p + f);
        // Two DIFs, no fragmentation.
        assert_eq!(wire_bytes(1000, &[1441, 1441]), 1000 + 2 * p + f);
        // The upper PDU (1441 + PCI) does not fit the lower DIF's 1441:
        // two lower fragments, each with its PCI and frame.
        assert_eq!(wire_bytes(1441, &[1441, 1441]), 1441 + 3 * p + 2 * f);
    }
}
