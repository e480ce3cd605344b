//! Congestion control and loss recovery of reliable flows (issue 21):
//! whole systems (`rina_core::system::System`) over emulated links, one
//! 10 Mb/s bottleneck with a 100-frame queue.
//!
//! Topology: `a` —100 Mb/s, 1 ms— `r` —10 Mb/s, 5 ms, 100 frames— `b`.
//! Every flow goes from an application at `a` to a sink at `b` over the
//! DIF's reliable cube (window flow control, retransmission, the
//! DCTCP-like congestion control); `r` relays, and its RMT port towards
//! `b` is paced at the bottleneck's rate, so the queue forms there and its
//! RMT marks. In the stacked case the same links carry a lower DIF
//! `low` (a, r, b) whose unreliable flow between `a` and `b` carries an
//! upper DIF `up` (a, b): the marks of `low`'s RMT at `r` reach the
//! reliable flows of `up`.
//!
//! Each flow writes SDUs of [`SDU`] bytes, numbered, as fast as it may for
//! the send phase, then stops; the sink checks that every flow's SDUs
//! arrive once and in order. Figures are printed (`--nocapture`).

use rina_core::efcp::EfcpConfig;
use rina_core::normal::cubes::QosCube;
use rina_core::normal::{MembershipConfig, NormalConfig};
use rina_core::rmt::{FifoConfig, PortRate, SchedulerConfig};
use rina_core::sdup::SdupConfig;
use rina_core::shim_udp;
use rina_core::system::{AppEvent, MediumId, NeighborSpec, Output, PortId, System};
use rina_core::Instant;
use rina_sim::backlog::LinkBacklogs;
use rina_sim::world::Ctx;
use rina_sim::{LinkConfig, LinkId, Node, World};
use rina_wire::{AppName, QosSpec};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

/// SDU size of the flows.
const SDU: usize = 1200;
/// Bottleneck rate.
const BOTTLENECK: u64 = 10_000_000;
/// Frames of the bottleneck's queue (and of the RMT queues).
const QUEUE: usize = 100;
/// Bytes a link adds to every datagram (IPv4 + UDP, as the lab's sim).
const LINK_OVERHEAD: u32 = 28;

fn name(s: &str) -> AppName {
    s.parse().unwrap()
}

fn ms(v: u64) -> Instant {
    Instant::from_nanos(v * 1_000_000)
}

fn end(link: usize, side: usize) -> SocketAddr {
    SocketAddr::from(([10, 0, link as u8, side as u8 + 1], 5000))
}

/// What the sink saw of one flow.
#[derive(Debug, Default, Clone)]
struct Rx {
    next: u64,
    dup_or_reordered: u64,
    bytes_in_window: u64,
    last_at: Option<Instant>,
}

/// One sending application.
#[derive(Debug)]
struct Tx {
    flow: u8,
    port: Option<PortId>,
    next: u64,
    stop_at: Instant,
}

/// A system, its media, its applications.
struct Host {
    sys: System,
    by_addr: BTreeMap<SocketAddr, MediumId>,
    media: BTreeMap<MediumId, SocketAddr>,
    backlog: LinkBacklogs,
    tx: Vec<Tx>,
    rx: BTreeMap<u8, Rx>,
    window: (Instant, Instant),
    failures: u64,
}

impl Host {
    fn new(sys: System) -> Self {
        Host {
            sys,
            by_addr: BTreeMap::new(),
            media: BTreeMap::new(),
            backlog: LinkBacklogs::default(),
            tx: Vec::new(),
            rx: BTreeMap::new(),
            window: (Instant::ZERO, Instant::ZERO),
            failures: 0,
        }
    }

    fn fill(&mut self, now: Instant) {
        for t in &mut self.tx {
            let Some(port) = t.port else { continue };
            while now < t.stop_at && self.sys.can_write(port, SDU) {
                let mut sdu = vec![0u8; SDU];
                sdu[0] = t.flow;
                sdu[1..9].copy_from_slice(&t.next.to_be_bytes());
                if self.sys.write(now, port, &sdu).is_err() {
                    break;
                }
                t.next += 1;
            }
        }
    }

    fn pump(&mut self, ctx: &mut Ctx<'_, ()>) {
        let now = ctx.now();
        self.fill(now);
        while let Some(o) = self.sys.poll_output() {
            match o {
                // The simulator's media are UDP links: every frame has a peer.
                Output::ToMedium { peer: None, .. } => {}
                Output::ToMedium {
                    medium,
                    peer: Some(peer),
                    frame,
                } => {
                    let frame = self.backlog.queue_behind(medium, peer, frame.into_vec());
                    if let (Some(frame), Some(&local)) = (frame, self.media.get(&medium)) {
                        ctx.transmit(local, peer, frame);
                    }
                }
                Output::ToApp { sdu, .. } => self.on_sdu(now, &sdu.into_buf()),
                Output::App(AppEvent::FlowRequest { handle, .. }) => {
                    let _ = self.sys.accept(now, handle);
                }
                Output::App(AppEvent::Allocated { port, .. }) => {
                    if let Some(t) = self.tx.iter_mut().find(|t| t.port == Some(port)) {
                        t.next = t.next.max(1);
                    }
                }
                Output::App(AppEvent::AllocateFailed { .. } | AppEvent::Deallocated { .. }) => {
                    self.failures += 1
                }
                Output::App(_)
                | Output::Membership { .. }
                | Output::RibRead { .. }
                | Output::Alarm { .. } => {}
            }
            self.fill(now);
        }
    }

    fn on_sdu(&mut self, now: Instant, sdu: &[u8]) {
        if sdu.len() < 9 {
            return;
        }
        let seq = u64::from_be_bytes(sdu[1..9].try_into().unwrap());
        let r = self.rx.entry(sdu[0]).or_default();
        if seq != r.next + 1 {
            r.dup_or_reordered += 1;
        }
        r.next = r.next.max(seq);
        if now >= self.window.0 && now < self.window.1 {
            r.bytes_in_window += sdu.len() as u64;
        }
        r.last_at = Some(now);
    }
}

/// Scripted: allocate the sending flows.
#[derive(Debug)]
enum Cmd {
    Start,
}

impl Node for Host {
    type Command = Cmd;
    type Event = ();

    fn addrs(&self) -> Vec<SocketAddr> {
        self.by_addr.keys().copied().collect()
    }

    fn on_datagram(&mut self, ctx: &mut Ctx<'_, ()>, to: SocketAddr, from: SocketAddr, p: &[u8]) {
        if let Some(&m) = self.by_addr.get(&to) {
            self.sys.handle_frame(ctx.now(), m, from, p);
        }
        self.pump(ctx);
    }

    fn on_timeout(&mut self, ctx: &mut Ctx<'_, ()>) {
        let now = ctx.now();
        let media = &self.media;
        self.backlog
            .retry(ctx, &mut self.sys, |m| media.get(&m).copied());
        if self.sys.poll_timeout().is_some_and(|t| t <= now) {
            self.sys.handle_timeout(now);
        }
        self.pump(ctx);
    }

    fn on_command(&mut self, ctx: &mut Ctx<'_, ()>, cmd: Cmd) {
        let Cmd::Start = cmd;
        let now = ctx.now();
        let dif = self.sys.members().last().map(|m| m.dif.clone());
        for i in 0..self.tx.len() {
            let qos = QosSpec {
                cube: Some(2),
                ..Default::default()
            };
            let port = self
                .sys
                .allocate(now, dif.as_deref(), name("src"), name("sink"), qos)
                .ok();
            self.tx[i].port = port;
        }
        self.pump(ctx);
    }

    fn poll_timeout(&self) -> Option<Instant> {
        let backlogs = self.backlog.poll_timeout();
        self.sys.poll_timeout().into_iter().chain(backlogs).min()
    }

    fn on_link_full(
        &mut self,
        now: Instant,
        from: SocketAddr,
        to: SocketAddr,
        payload: Vec<u8>,
        room_at: Instant,
    ) -> Option<Vec<u8>> {
        let Some(&m) = self.by_addr.get(&from) else {
            return Some(payload);
        };
        self.backlog
            .hold(&mut self.sys, now, m, to, payload, room_at);
        None
    }
}

/// The scenario.
#[derive(Debug, Clone, Copy)]
struct Scenario {
    flows: u8,
    loss: f64,
    stacked: bool,
    /// Seconds of sending.
    send_secs: u64,
    seed: u64,
}

fn cubes() -> Vec<QosCube> {
    vec![
        QosCube::new(1, "unreliable", EfcpConfig::unreliable()),
        QosCube::new(2, "reliable", EfcpConfig::reliable()),
    ]
}

/// A normal IPCP's configuration: address `addr` in `dif`, routing and
/// membership by hellos (addresses are static), PDUs of at most `max_pdu`.
fn normal_cfg(dif: &str, addr: u64, ipcp: &str, max_pdu: u32) -> NormalConfig {
    let mut c = NormalConfig::new(dif, addr);
    c.dt.max_pdu_size = max_pdu;
    c.sdup = SdupConfig {
        ttl: Some(64),
        crc: true,
    };
    c.cubes = cubes();
    c.routing = Some(rina_core::routing::Config::default());
    c.membership = Some(MembershipConfig::new(name(ipcp)));
    c.directory.insert(name("sink"), 3);
    c
}

fn fifo() -> SchedulerConfig {
    SchedulerConfig::Fifo(FifoConfig { queue_len: QUEUE })
}

/// Node `i` (0 = a, 1 = r, 2 = b) of the line, with its shims on links
/// 0 (a–r) and 1 (r–b).
fn host(i: usize, sc: Scenario) -> Host {
    let names = ["a", "r", "b"];
    let mut sys = System::new(names[i]);
    let mut host_media = Vec::new();
    let lower = if sc.stacked { "low" } else { "net" };
    for (link, sides) in [(0usize, [0usize, 1]), (1, [1, 2])] {
        let Some(side) = sides.iter().position(|&n| n == i) else {
            continue;
        };
        let peer = sides[1 - side];
        let mut cfg = shim_udp::Config::new(format!("l{link}"));
        cfg.directory.insert(
            name(&format!("{}.{lower}", names[peer])),
            end(link, 1 - side),
        );
        let bps = if link == 1 {
            BOTTLENECK
        } else {
            10 * BOTTLENECK
        };
        let rate = PortRate::new(bps)
            .overhead(LINK_OVERHEAD + rina_wire::shim_udp::DATA_HEADER_LEN as u32);
        let m = sys
            .add_shim_udp(format!("l{link}"), cfg, Some(rate))
            .unwrap();
        host_media.push((end(link, side), m));
        let _ = peer;
    }
    let nbs = |over: &str, dif: &str, peers: &[usize]| -> Vec<NeighborSpec> {
        peers
            .iter()
            .map(|&p| NeighborSpec {
                name: name(&format!("{}.{dif}", names[p])),
                over: over.into(),
                address: None,
            })
            .collect()
    };
    let line_peers: Vec<usize> = match i {
        0 => vec![1],
        1 => vec![0, 2],
        _ => vec![1],
    };
    let mut low_nbs = Vec::new();
    for &p in &line_peers {
        let link = if p.min(i) == 0 { "l0" } else { "l1" };
        low_nbs.extend(nbs(link, lower, &[p]));
    }
    let ipcp = format!("{}.{lower}", names[i]);
    let mut low = normal_cfg(lower, i as u64 + 1, &ipcp, 1470);
    if sc.stacked {
        low.directory.clear();
        low.directory.insert(name("a.up"), 1);
        low.directory.insert(name("b.up"), 3);
    }
    sys.add_normal(name(&ipcp), low, &fifo(), low_nbs, BTreeMap::new())
        .unwrap();
    if sc.stacked && i != 1 {
        let peer = 2 - i;
        let ipcp = format!("{}.up", names[i]);
        let mut up = normal_cfg("up", i as u64 + 1, &ipcp, 1400);
        // The upper DIF's N-1 flows use the lower DIF's unreliable cube.
        up.cubes = cubes();
        let nb = nbs("low", "up", &[peer]);
        sys.add_normal(name(&ipcp), up, &fifo(), nb, BTreeMap::new())
            .unwrap();
    }
    if i == 2 {
        let dif = if sc.stacked { "up" } else { "net" };
        sys.register(dif, name("sink")).unwrap();
    }
    let mut h = Host::new(sys);
    for (addr, m) in host_media {
        h.by_addr.insert(addr, m);
        h.media.insert(m, addr);
    }
    h
}

/// What a run measured.
#[derive(Debug)]
struct Outcome {
    /// Goodput of each flow in the measuring window, bits per second.
    goodput: Vec<f64>,
    /// Bottleneck utilisation in the window (bytes on the wire / capacity).
    utilisation: f64,
    jain: f64,
    /// Every flow delivered everything it wrote, in order, once.
    complete: bool,
    /// Fraction of RMT queue samples (every ms) above the threshold.
    above_threshold: f64,
    marked: u64,
    /// SDUs each flow wrote.
    #[allow(dead_code)]
    written: Vec<u64>,
}

fn jain(x: &[f64]) -> f64 {
    let s: f64 = x.iter().sum();
    let q: f64 = x.iter().map(|v| v * v).sum();
    if q == 0.0 {
        return 0.0;
    }
    s * s / (x.len() as f64 * q)
}

/// Queued data PDUs and ECN marks at `r`'s RMTs.
fn r_queue(w: &World<Host>, r: usize) -> (usize, u64) {
    let sys = &w.node(r).sys;
    let mut q = 0;
    let mut marked = 0;
    for m in 0..sys.members().len() {
        if let Some(n) = sys.member(m).and_then(|m| m.normal()) {
            q += n
                .rmt()
                .ports()
                .flat_map(|p| n.rmt().queue_stats(p))
                .map(|s| s.queued)
                .sum::<usize>();
            marked += n.rmt().counters().ecn_marked;
        }
    }
    (q, marked)
}

fn run(sc: Scenario) -> Outcome {
    let mut w: World<Host> = World::new(sc.seed);
    w.set_tracing(false);
    w.set_step_limit(u64::MAX);
    let ids: Vec<usize> = (0..3).map(|i| w.add_node(host(i, sc))).collect();
    let mut links: Vec<LinkId> = Vec::new();
    for (link, bps, delay) in [(0usize, 10 * BOTTLENECK, 1u64), (1, BOTTLENECK, 5)] {
        let cfg = LinkConfig::new(bps, Duration::from_millis(delay))
            .queue(QUEUE)
            .overhead(LINK_OVERHEAD);
        links.push(w.connect(end(link, 0), end(link, 1), cfg));
    }
    // Routing and hellos settle; then the flows start.
    let start = ms(3000);
    let stop = start + Duration::from_secs(sc.send_secs);
    let window = (start + Duration::from_secs(2), stop);
    for f in 0..sc.flows {
        w.node_mut(ids[0]).tx.push(Tx {
            flow: f,
            port: None,
            next: 1,
            stop_at: stop,
        });
    }
    w.node_mut(ids[2]).window = window;
    w.schedule(start, ids[0], Cmd::Start);
    // The bottleneck loses at random once the flows are set up (the loss
    // figures are about the data path, not about allocation under loss).
    w.run_until(start + Duration::from_millis(200)).unwrap();
    w.set_link_loss(links[1], sc.loss);
    w.run_until(window.0).unwrap();
    let wire0 = w.link_counters(links[1], end(1, 0));
    let mut samples = 0u64;
    let mut above = 0u64;
    let threshold = rina_core::rmt::DEFAULT_ECN_THRESHOLD;
    let mut t = window.0;
    while t < window.1 {
        t = t + Duration::from_millis(1);
        w.run_until(t).unwrap();
        let (q, _) = r_queue(&w, ids[1]);
        samples += 1;
        above += u64::from(q > threshold);
    }
    let wire1 = w.link_counters(links[1], end(1, 0));
    if std::env::var_os("CC_DEBUG").is_some() {
        for m in w.node(ids[0]).sys.members() {
            if let Some(n) = m.normal() {
                for (f, _) in n.flows() {
                    println!("  a {} flow {f}: {:?}", m.dif, n.flow_stats(f));
                }
            }
        }
    }

    w.run_until(stop + Duration::from_secs(20)).unwrap();
    let secs = (window.1 - window.0).as_secs_f64();
    let bytes = (wire1.bytes_delivered - wire0.bytes_delivered) as f64
        + (wire1.delivered - wire0.delivered) as f64 * f64::from(LINK_OVERHEAD);
    let utilisation = bytes * 8.0 / (BOTTLENECK as f64 * secs);
    let a = w.node(ids[0]);
    let b = w.node(ids[2]);
    let written: Vec<u64> = a.tx.iter().map(|t| t.next - 1).collect();
    let mut complete = a.failures == 0 && b.failures == 0;
    let mut goodput = Vec::new();
    for (f, &n) in written.iter().enumerate() {
        let rx = b.rx.get(&(f as u8)).cloned().unwrap_or_default();
        complete &= rx.next == n && rx.dup_or_reordered == 0 && n > 0;
        goodput.push(rx.bytes_in_window as f64 * 8.0 / secs);
    }
    let (_, marked) = r_queue(&w, ids[1]);
    let out = Outcome {
        jain: jain(&goodput),
        goodput,
        utilisation,
        complete,
        above_threshold: above as f64 / samples.max(1) as f64,
        marked,
        written,
    };
    println!("{sc:?}\n  {out:?}");
    out
}

/// The issue's bound: the bottleneck's queue stays below the marking
/// threshold most of the time. "Above" is holding more than the threshold,
/// which is when the PDUs leaving it are marked (measured: 0.09 for 1
/// flow, 0.21 for 3, 0.42 for 10, 0.11 stacked).
const MAX_ABOVE: f64 = 0.5;

fn check_bottleneck(flows: u8, stacked: bool) {
    let o = run(Scenario {
        flows,
        loss: 0.0,
        stacked,
        send_secs: 8,
        seed: 21,
    });
    assert!(o.complete, "every flow completes, once and in order: {o:?}");
    assert!(o.utilisation >= 0.90, "utilisation {o:?}");
    assert!(o.jain >= 0.95, "fairness {o:?}");
    assert!(
        o.above_threshold < MAX_ABOVE,
        "queue below the threshold {o:?}"
    );
    assert!(o.marked > 0, "the bottleneck marked {o:?}");
}

#[test]
fn one_reliable_flow_fills_the_bottleneck() {
    check_bottleneck(1, false);
}

#[test]
fn three_reliable_flows_share_the_bottleneck() {
    check_bottleneck(3, false);
}

#[test]
fn ten_reliable_flows_share_the_bottleneck() {
    check_bottleneck(10, false);
}

#[test]
fn three_reliable_flows_of_a_stacked_dif_share_a_congested_lower_dif() {
    check_bottleneck(3, true);
}

fn check_loss(loss: f64, share: f64) {
    let o = run(Scenario {
        flows: 1,
        loss,
        stacked: false,
        send_secs: 10,
        seed: 5,
    });
    assert!(o.complete, "delivered once and in order: {o:?}");
    let g = o.goodput[0] / BOTTLENECK as f64;
    assert!(
        g >= share,
        "goodput {g:.3} of capacity at {loss} loss: {o:?}"
    );
}

#[test]
fn five_percent_random_loss_keeps_sixty_percent_goodput() {
    check_loss(0.05, 0.60);
}

#[test]
fn twenty_percent_random_loss_keeps_a_quarter_goodput() {
    check_loss(0.20, 0.25);
}
