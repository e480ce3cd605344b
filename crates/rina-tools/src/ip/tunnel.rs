//! The running tunnel: the shared state of every peer and flow, and the
//! threads that move packets and keep the flows up.
//!
//! * one thread reads the TUN, picks the peer by longest-prefix match on the
//!   destination and the flow by DSCP, and writes the packet to that flow
//!   (waiting at most [`TX_WAIT`] for room, then dropping);
//! * one thread per live flow reads SDUs and writes the IP packets among
//!   them to the TUN (keepalives refresh the flow, anything else is counted
//!   and dropped);
//! * one thread keeps the daemon connection and the registration of the
//!   tunnel's name, and accepts flows from configured peers (a new flow from
//!   a peer replaces its old one: the peer restarted);
//! * one thread per flow this side allocates re-allocates it with
//!   exponential back-off whenever it is down;
//! * one thread sends keepalives and closes flows on which nothing arrived
//!   for `dead_after` (a daemon that restarted at the far end does not
//!   close our end of the flow).

use super::backoff::Backoff;
use super::config::{Config, PeerConfig, IPV6_MIN_MTU};
use super::packet::{KEEPALIVE, PARTIAL_HEADER};
use super::ratelimit::TokenBucket;
use super::route::RouteTable;
use super::status::{ChannelStatus, PeerCounters, PeerStatus, Status};
use super::tun::{LinkWatch, Tun, TunError};
use super::IpError;
use rina::{Client, Flow, IncomingFlow};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

/// Longest wait for room in a full flow before the packet is dropped.
pub const TX_WAIT: Duration = Duration::from_millis(20);

/// How often blocking loops look at the stop flag.
const TICK: Duration = Duration::from_millis(250);

/// Largest IP packet (and TUN MTU).
const MAX_PACKET: usize = 65535;

/// Smallest MTU set on the TUN (IPv4's minimum).
const MIN_MTU: u32 = 68;

/// Control calls (allocate, accept, register) give up after this long.
const CONTROL_TIMEOUT: Duration = Duration::from_secs(10);

macro_rules! log {
    ($($t:tt)*) => { eprintln!("rina-ip: {}", format_args!($($t)*)) };
}

mod data;

#[derive(Debug, Default)]
struct Counters {
    packets_in: AtomicU64,
    bytes_in: AtomicU64,
    packets_out: AtomicU64,
    bytes_out: AtomicU64,
    drops_no_flow: AtomicU64,
    drops_too_big: AtomicU64,
    too_big_icmp: AtomicU64,
    unreachable_icmp: AtomicU64,
    fragmented: AtomicU64,
    drops_full: AtomicU64,
    drops_invalid: AtomicU64,
    drops_source: AtomicU64,
    drops_tun: AtomicU64,
    keepalives_in: AtomicU64,
    flows_up: AtomicU64,
    reallocations: AtomicU64,
    alloc_failures: AtomicU64,
    dead_flows: AtomicU64,
}

impl Counters {
    fn snapshot(&self) -> PeerCounters {
        let g = |a: &AtomicU64| a.load(Relaxed);
        PeerCounters {
            packets_in: g(&self.packets_in),
            bytes_in: g(&self.bytes_in),
            packets_out: g(&self.packets_out),
            bytes_out: g(&self.bytes_out),
            drops_no_flow: g(&self.drops_no_flow),
            drops_too_big: g(&self.drops_too_big),
            too_big_icmp: g(&self.too_big_icmp),
            unreachable_icmp: g(&self.unreachable_icmp),
            fragmented: g(&self.fragmented),
            drops_full: g(&self.drops_full),
            drops_invalid: g(&self.drops_invalid),
            drops_source: g(&self.drops_source),
            drops_tun: g(&self.drops_tun),
            keepalives_in: g(&self.keepalives_in),
            flows_up: g(&self.flows_up),
            reallocations: g(&self.reallocations),
            alloc_failures: g(&self.alloc_failures),
            dead_flows: g(&self.dead_flows),
        }
    }
}

fn bump(a: &AtomicU64) {
    a.fetch_add(1, Relaxed);
}

/// A flow in service.
#[derive(Debug)]
struct Live {
    flow: Flow,
    /// Tells this flow from the one that replaces it.
    gen: u64,
    since: Instant,
    /// Milliseconds after the tunnel's start when the last SDU arrived.
    last_rx_ms: AtomicU64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Up,
    Allocating,
    Waiting,
    Backoff,
}

#[derive(Debug)]
struct SlotState {
    live: Option<Arc<Live>>,
    phase: Phase,
    last_error: Option<String>,
    retry_at: Option<Instant>,
    ever_up: bool,
}

/// One flow of a peer (one QoS profile).
#[derive(Debug)]
struct Slot {
    state: Mutex<SlotState>,
    /// Packets sent on this slot's flows.
    packets_out: AtomicU64,
    /// Signalled when the flow goes down (or the tunnel stops).
    cv: Condvar,
}

#[derive(Debug)]
struct Peer {
    cfg: PeerConfig,
    slots: Vec<Slot>,
    counters: Counters,
}

#[derive(Debug)]
struct Shared {
    cfg: Config,
    tun: Tun,
    routes: RouteTable,
    peers: Vec<Peer>,
    start: Instant,
    mtu: AtomicU32,
    stop: AtomicBool,
    /// Why the tunnel ended, once it has; [`Tunnel::wait`] waits on `ended`.
    end: Mutex<Option<End>>,
    ended: Condvar,
    registered: AtomicBool,
    /// The TUN's MTU went below IPv6's minimum since its addresses were
    /// last given, which took its IPv6 addresses away.
    v6_lost: AtomicBool,
    daemon_error: Mutex<Option<String>>,
    drops_no_route: AtomicU64,
    /// ICMP "no route" errors written to the TUN.
    no_route_icmp: AtomicU64,
    /// Bounds the ICMP errors written to the TUN.
    icmp_bucket: Mutex<TokenBucket>,
    /// ICMP errors that were due but not written ([`Shared::icmp_bucket`]
    /// was empty).
    icmp_rate_limited: AtomicU64,
    drops_tun_invalid: AtomicU64,
    refused: AtomicU64,
    next_gen: AtomicU64,
    /// Packets sent with their checksum left partial.
    partial_out: AtomicU64,
    /// Partial-checksum packets received (and, without offload, completed).
    partial_in: AtomicU64,
}

/// How a tunnel ended.
#[derive(Debug, Clone)]
enum End {
    /// [`Tunnel::stop`] stopped it.
    Stopped,
    /// Its TUN interface failed (deleted, or no longer readable).
    TunFailed(String),
}

/// Locks `m`, carrying on with the data if a thread panicked holding it.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A running tunnel; [`Tunnel::stop`] ends its threads.
#[derive(Debug, Clone)]
pub struct Tunnel {
    shared: Arc<Shared>,
}

impl Tunnel {
    /// Sets up the TUN interface (addresses, routes, initial MTU) and starts
    /// every thread.
    pub fn start(cfg: Config) -> Result<Tunnel, IpError> {
        let tun = Tun::create(&cfg.tun.name, cfg.tun.checksum_offload)?;
        let mtu = cfg.tun.mtu_cap.unwrap_or(1500);
        tun.set_mtu(mtu)?;
        tun.up()?;
        address(&tun, &cfg, Err)?;
        let routes = RouteTable::new(
            cfg.peers
                .iter()
                .enumerate()
                .flat_map(|(i, p)| p.prefixes.iter().map(move |&x| (x, i))),
        );
        let peers = cfg
            .peers
            .iter()
            .map(|p| Peer {
                cfg: p.clone(),
                slots: p
                    .channels
                    .iter()
                    .map(|_| Slot {
                        state: Mutex::new(SlotState {
                            live: None,
                            phase: if p.allocates {
                                Phase::Allocating
                            } else {
                                Phase::Waiting
                            },
                            last_error: None,
                            retry_at: None,
                            ever_up: false,
                        }),
                        cv: Condvar::new(),
                        packets_out: AtomicU64::new(0),
                    })
                    .collect(),
                counters: Counters::default(),
            })
            .collect();
        let listener = super::status::bind(&cfg.status_socket)?;
        let shared = Arc::new(Shared {
            cfg,
            tun,
            routes,
            peers,
            start: Instant::now(),
            mtu: AtomicU32::new(mtu),
            stop: AtomicBool::new(false),
            end: Mutex::new(None),
            ended: Condvar::new(),
            registered: AtomicBool::new(false),
            v6_lost: AtomicBool::new(false),
            daemon_error: Mutex::new(None),
            drops_no_route: AtomicU64::new(0),
            no_route_icmp: AtomicU64::new(0),
            icmp_bucket: Mutex::new(TokenBucket::icmp()),
            icmp_rate_limited: AtomicU64::new(0),
            drops_tun_invalid: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            next_gen: AtomicU64::new(1),
            partial_out: AtomicU64::new(0),
            partial_in: AtomicU64::new(0),
        });
        let s = shared.clone();
        spawn("rina-ip-status", move || {
            super::status::serve(listener, || s.status())
        })?;
        let s = shared.clone();
        spawn("rina-ip-tun", move || s.tun_loop())?;
        let s = shared.clone();
        spawn("rina-ip-accept", move || s.accept_loop())?;
        let s = shared.clone();
        spawn("rina-ip-keepalive", move || s.keepalive_loop())?;
        for (pi, p) in shared.peers.iter().enumerate() {
            if !p.cfg.allocates {
                continue;
            }
            for ci in 0..p.slots.len() {
                let s = shared.clone();
                spawn("rina-ip-alloc", move || s.alloc_loop(pi, ci))?;
            }
        }
        Ok(Tunnel { shared })
    }

    /// The current state and counters.
    pub fn status(&self) -> Status {
        self.shared.status()
    }

    /// Stops the threads (they notice within a quarter of a second) and
    /// removes the status socket. The TUN interface goes with the process.
    pub fn stop(&self) {
        self.shared.end(End::Stopped);
        let _ = std::fs::remove_file(&self.shared.cfg.status_socket);
    }

    /// Waits until the tunnel ends: `Ok` once [`Tunnel::stop`] stopped it,
    /// [`IpError::TunLost`] if its TUN interface failed first (the threads
    /// are then stopping; call [`Tunnel::stop`] to remove the status
    /// socket).
    pub fn wait(&self) -> Result<(), IpError> {
        let mut end = lock(&self.shared.end);
        loop {
            match &*end {
                Some(End::Stopped) => return Ok(()),
                Some(End::TunFailed(why)) => return Err(IpError::TunLost(why.clone())),
                None => {
                    end = self
                        .shared
                        .ended
                        .wait(end)
                        .unwrap_or_else(|p| p.into_inner())
                }
            }
        }
    }
}

/// Gives the TUN its addresses and the routes to the peers' prefixes
/// (those not on a link of its addresses), as configured; idempotent.
/// A step that fails goes to `failed`, whose error ends the work and whose
/// `Ok` carries on with the next step.
fn address(
    tun: &Tun,
    cfg: &Config,
    mut failed: impl FnMut(TunError) -> Result<(), TunError>,
) -> Result<(), TunError> {
    for a in &cfg.tun.addresses {
        tun.add_address(a).or_else(&mut failed)?;
    }
    if cfg.tun.routes {
        let on_link: Vec<_> = cfg.tun.addresses.iter().map(|a| a.network()).collect();
        for p in cfg.peers.iter().flat_map(|p| &p.prefixes) {
            if !on_link.iter().any(|l| l.covers(p)) {
                tun.add_route(p).or_else(&mut failed)?;
            }
        }
    }
    Ok(())
}

fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> Result<(), IpError> {
    thread::Builder::new()
        .name(name.into())
        .spawn(f)
        .map(|_| ())
        .map_err(IpError::Thread)
}

impl Shared {
    fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    fn stopped(&self) -> bool {
        self.stop.load(Relaxed)
    }

    /// Ends the tunnel (the first reason given stays): every thread stops
    /// and [`Tunnel::wait`] returns.
    fn end(&self, why: End) {
        lock(&self.end).get_or_insert(why);
        self.stop.store(true, Relaxed);
        for p in &self.peers {
            for s in &p.slots {
                s.cv.notify_all();
            }
        }
        self.ended.notify_all();
    }

    /// Puts `flow` in service as flow `ci` of peer `pi`, replacing (and
    /// closing) the one there.
    fn install(self: &Arc<Self>, pi: usize, ci: usize, flow: Flow, how: &str) {
        let peer = &self.peers[pi];
        let gen = self.next_gen.fetch_add(1, Relaxed);
        let port = flow.info().port;
        let max_sdu = flow.max_sdu();
        let live = Arc::new(Live {
            flow,
            gen,
            since: Instant::now(),
            last_rx_ms: AtomicU64::new(self.now_ms()),
        });
        let old = {
            let mut st = lock(&peer.slots[ci].state);
            let old = st.live.replace(live.clone());
            st.phase = Phase::Up;
            st.retry_at = None;
            if st.ever_up {
                bump(&peer.counters.reallocations);
            }
            st.ever_up = true;
            old
        };
        bump(&peer.counters.flows_up);
        if let Some(old) = old {
            old.flow.shutdown();
        }
        log!(
            "flow {} to {} ({}) up, {how}, max SDU {max_sdu} bytes",
            port,
            peer.cfg.name,
            peer.cfg.channels[ci].qos_name
        );
        self.update_mtu();
        let s = self.clone();
        if let Err(e) = spawn("rina-ip-flow", move || s.flow_loop(pi, ci, live)) {
            self.fail(pi, ci, gen, &e.to_string());
        }
    }

    /// Takes flow `gen` of slot (`pi`, `ci`) out of service, if it is still
    /// the one there, and wakes the slot's allocator.
    fn fail(&self, pi: usize, ci: usize, gen: u64, why: &str) {
        let peer = &self.peers[pi];
        let slot = &peer.slots[ci];
        let taken = {
            let mut st = lock(&slot.state);
            if st.live.as_ref().is_some_and(|l| l.gen == gen) {
                st.last_error = Some(why.to_owned());
                st.phase = if peer.cfg.allocates {
                    Phase::Allocating
                } else {
                    Phase::Waiting
                };
                st.live.take()
            } else {
                None
            }
        };
        if let Some(l) = taken {
            l.flow.shutdown();
            log!(
                "flow {} to {} ({}) down: {why}",
                l.flow.info().port,
                peer.cfg.name,
                peer.cfg.channels[ci].qos_name
            );
            slot.cv.notify_all();
        }
    }

    /// The flow of peer `pi` that DSCP `dscp` maps to.
    fn channel(&self, pi: usize, dscp: u8) -> usize {
        usize::from(self.peers[pi].cfg.dscp[usize::from(dscp & 63)])
    }

    /// The flow to send a packet with DSCP `dscp` to peer `pi` on: the one
    /// the DSCP maps to, or the peer's default flow if that one is down.
    fn pick(&self, pi: usize, dscp: u8) -> Option<(usize, Arc<Live>)> {
        let peer = &self.peers[pi];
        let ci = self.channel(pi, dscp);
        if let Some(l) = peer.slots.get(ci).and_then(|s| lock(&s.state).live.clone()) {
            return Some((ci, l));
        }
        lock(&peer.slots[0].state).live.clone().map(|l| (0, l))
    }

    /// Sets the TUN MTU to the smallest max SDU of the live flows (and the
    /// configured cap).
    fn update_mtu(&self) {
        let smallest = self
            .peers
            .iter()
            .flat_map(|p| &p.slots)
            .filter_map(|s| lock(&s.state).live.as_ref().map(|l| l.flow.max_sdu()))
            .min();
        let Some(sdu) = smallest else {
            return;
        };
        let mtu = self.mtu_for(sdu).max(MIN_MTU);
        if self.mtu.swap(mtu, Relaxed) != mtu {
            match self.tun.set_mtu(mtu) {
                Ok(()) => log!("{} MTU set to {mtu}", self.tun.name()),
                Err(e) => log!("{e}"),
            }
            self.mtu_changed(mtu);
        }
    }

    /// Notes that the TUN's MTU is now `mtu`: below IPv6's minimum the
    /// kernel takes the TUN's IPv6 addresses away (and does not give them
    /// back when the MTU rises), so once it is at least that again they
    /// are given again, with the routes.
    fn mtu_changed(&self, mtu: u32) {
        if !self.cfg.tun.addresses.iter().any(|a| a.addr.is_ipv6()) {
            return;
        }
        if mtu < IPV6_MIN_MTU {
            if !self.v6_lost.swap(true, Relaxed) {
                log!("MTU {mtu} is below IPv6's minimum of {IPV6_MIN_MTU}: IPv6 will not work on the tunnel until it rises");
            }
        } else if self.v6_lost.swap(false, Relaxed) {
            log!(
                "{} MTU {mtu} is IPv6's minimum or more again: its addresses and routes are set again",
                self.tun.name()
            );
            self.readdress();
        }
    }

    /// Gives the TUN its addresses and routes again; each step that fails
    /// is logged and the others are done.
    fn readdress(&self) {
        let _ = address(&self.tun, &self.cfg, |e| {
            log!("{e}");
            Ok(())
        });
    }

    /// The largest IP packet a flow whose largest SDU is `sdu` carries
    /// whatever its checksum (less the partial-checksum frame's header
    /// where the TUN offloads), capped by the configured MTU.
    fn mtu_for(&self, mut sdu: usize) -> u32 {
        if self.tun.csum_offload() {
            // Room for the partial-checksum frame's header.
            sdu = sdu.saturating_sub(PARTIAL_HEADER);
        }
        let mtu = sdu.min(MAX_PACKET) as u32;
        self.cfg.tun.mtu_cap.map_or(mtu, |cap| mtu.min(cap))
    }

    /// Notices the TUN set down and up again (`tun_up` is what it was last
    /// time; `watch` has the kernel's word for a down too short for a
    /// look at the flags to see): setting a link down takes its IPv6
    /// addresses and the routes through it away, and up does not bring
    /// them back, so they are given again (with the MTU). Likewise when
    /// its MTU, set by hand, went below IPv6's minimum and rose again
    /// ([`Shared::mtu_changed`]).
    fn watch_tun(&self, watch: Option<&LinkWatch>, tun_up: &mut bool) {
        let news = watch.map(LinkWatch::news).unwrap_or_default();
        if news.down && *tun_up {
            log!("{} went down", self.tun.name());
            *tun_up = false;
        }
        // The MTU set by hand, perhaps below IPv6's minimum and back.
        if let Some(m) = news.smallest_mtu {
            self.mtu_changed(m);
        }
        match self.tun.mtu() {
            Ok(m) => self.mtu_changed(m),
            Err(e) => log!("{e}"),
        }
        let up = match self.tun.is_up() {
            Ok(up) => up,
            Err(e) => return log!("{e}"),
        };
        match (*tun_up, up) {
            (true, false) => log!("{} is down", self.tun.name()),
            (false, true) => {
                log!(
                    "{} is up again: its addresses and routes are set again",
                    self.tun.name()
                );
                if let Err(e) = self.tun.set_mtu(self.mtu.load(Relaxed)) {
                    log!("{e}");
                }
                // None is tried again here: what fails now (an IPv6
                // address on a TUN whose MTU is below IPv6's minimum) is
                // given again once the MTU rises (`mtu_changed`).
                self.readdress();
            }
            _ => {}
        }
        *tun_up = up;
    }

    /// Keepalives out; flows silent for too long closed; the TUN watched
    /// ([`Shared::watch_tun`]).
    fn keepalive_loop(self: Arc<Self>) {
        let t = self.cfg.timers;
        let dead_ms = t.dead_after.as_millis() as u64;
        let mut tun_up = true;
        let watch = LinkWatch::open(self.tun.name())
            .map_err(|e| log!("no link announcements for {}: {e}", self.tun.name()))
            .ok();
        while !self.stopped() {
            self.watch_tun(watch.as_ref(), &mut tun_up);
            let now = self.now_ms();
            for (pi, p) in self.peers.iter().enumerate() {
                for (ci, s) in p.slots.iter().enumerate() {
                    let Some(live) = lock(&s.state).live.clone() else {
                        continue;
                    };
                    let silent = now.saturating_sub(live.last_rx_ms.load(Relaxed));
                    if silent > dead_ms {
                        bump(&p.counters.dead_flows);
                        self.fail(
                            pi,
                            ci,
                            live.gen,
                            &format!("nothing received for {silent} ms"),
                        );
                        continue;
                    }
                    // A full flow carries traffic anyway: no need to wait.
                    let _ = live.flow.write_timeout(&KEEPALIVE, Duration::ZERO);
                }
            }
            self.sleep(t.keepalive);
        }
    }

    /// Sleeps `d`, waking early if the tunnel stops.
    fn sleep(&self, d: Duration) {
        let end = Instant::now() + d;
        while !self.stopped() {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            thread::park_timeout(left.min(TICK));
        }
    }

    fn connect(&self) -> rina::Result<Client> {
        let mut c = crate::opts::connect(self.cfg.socket.as_deref())?;
        c.set_timeout(Some(CONTROL_TIMEOUT));
        c.set_rings(self.cfg.rings);
        Ok(c)
    }

    fn set_daemon_error(&self, e: Option<String>) {
        *lock(&self.daemon_error) = e;
    }

    /// Keeps the registration, accepts the peers' flows.
    fn accept_loop(self: Arc<Self>) {
        let t = self.cfg.timers;
        let mut backoff = Backoff::new(t.backoff_initial, t.backoff_max);
        let mut rng = rand::thread_rng();
        while !self.stopped() {
            let mut client = match self.connect().and_then(|mut c| {
                c.register(&self.cfg.name, self.cfg.dif.as_deref())
                    .map(|difs| (c, difs))
            }) {
                Ok((c, difs)) => {
                    log!("registered {} in {}", self.cfg.name, difs.join(", "));
                    self.registered.store(true, Relaxed);
                    self.set_daemon_error(None);
                    backoff.reset();
                    c
                }
                Err(e) => {
                    self.set_daemon_error(Some(e.to_string()));
                    let d = backoff.next_delay(&mut rng);
                    log!("cannot register {}: {e}; retrying in {d:?}", self.cfg.name);
                    self.sleep(d);
                    continue;
                }
            };
            while !self.stopped() {
                match client.next_request_timeout(TICK) {
                    Ok(Some(req)) => self.on_request(&mut client, &req),
                    Ok(None) => {}
                    Err(e) => {
                        log!("lost the daemon: {e}");
                        self.set_daemon_error(Some(e.to_string()));
                        break;
                    }
                }
            }
            self.registered.store(false, Relaxed);
        }
    }

    fn on_request(self: &Arc<Self>, client: &mut Client, req: &IncomingFlow) {
        let Some(pi) = self.peers.iter().position(|p| p.cfg.name == req.remote) else {
            bump(&self.refused);
            log!("refusing a flow from {}: not a configured peer", req.remote);
            let _ = client.refuse(req, "not a configured peer of this rina-ip");
            return;
        };
        let chans = &self.peers[pi].cfg.channels;
        // Strict: were two different QoS requests put on one slot, each
        // would replace the other's flow forever.
        let ci = match chans.iter().position(|c| c.spec == req.qos) {
            Some(ci) => ci,
            None => {
                bump(&self.refused);
                log!(
                    "refusing a flow from {}: its QoS {:?} matches none of its profiles",
                    req.remote,
                    req.qos
                );
                let _ = client.refuse(req, "QoS matches no profile configured for this peer");
                return;
            }
        };
        match client.accept(req) {
            Ok(flow) => self.install(pi, ci, flow, "accepted"),
            Err(e) => log!("cannot accept the flow from {}: {e}", req.remote),
        }
    }

    /// Allocates flow `ci` of peer `pi` whenever it is down.
    fn alloc_loop(self: Arc<Self>, pi: usize, ci: usize) {
        let t = self.cfg.timers;
        let peer = &self.peers[pi];
        let slot = &peer.slots[ci];
        let spec = peer.cfg.channels[ci].spec;
        let mut backoff = Backoff::new(t.backoff_initial, t.backoff_max);
        let mut rng = rand::thread_rng();
        let mut client: Option<Client> = None;
        loop {
            {
                let mut st = lock(&slot.state);
                while st.live.is_some() && !self.stopped() {
                    st = slot
                        .cv
                        .wait_timeout(st, TICK * 4)
                        .map(|(g, _)| g)
                        .unwrap_or_else(|p| p.into_inner().0);
                }
                st.phase = Phase::Allocating;
                st.retry_at = None;
            }
            if self.stopped() {
                return;
            }
            let result = match client.take() {
                Some(c) => Ok(c),
                None => self.connect(),
            }
            .and_then(|mut c| {
                let r = c.allocate(
                    &self.cfg.name,
                    &peer.cfg.name,
                    self.cfg.dif.as_deref(),
                    &spec,
                );
                match r {
                    Ok(f) => {
                        client = Some(c);
                        Ok(f)
                    }
                    Err(e) => {
                        if !e.is_closed() {
                            client = Some(c);
                        }
                        Err(e)
                    }
                }
            });
            match result {
                Ok(flow) => {
                    backoff.reset();
                    self.install(pi, ci, flow, "allocated");
                }
                Err(e) => {
                    bump(&peer.counters.alloc_failures);
                    let d = backoff.next_delay(&mut rng);
                    {
                        let mut st = lock(&slot.state);
                        st.phase = Phase::Backoff;
                        st.retry_at = Some(Instant::now() + d);
                        st.last_error = Some(e.to_string());
                    }
                    log!(
                        "cannot allocate a flow to {} ({}): {e}; retrying in {d:?}",
                        peer.cfg.name,
                        peer.cfg.channels[ci].qos_name
                    );
                    self.sleep(d);
                }
            }
        }
    }

    fn status(&self) -> Status {
        let now = Instant::now();
        let peers = self
            .peers
            .iter()
            .map(|p| {
                let channels: Vec<ChannelStatus> = p
                    .slots
                    .iter()
                    .zip(&p.cfg.channels)
                    .map(|(s, ch)| {
                        let st = lock(&s.state);
                        let (phase, retry_in_ms) = match (st.phase, st.retry_at) {
                            (Phase::Backoff, Some(t)) => (
                                "backoff",
                                Some(t.saturating_duration_since(now).as_millis() as u64),
                            ),
                            (Phase::Up, _) => ("up", None),
                            (Phase::Allocating, _) => ("allocating", None),
                            (Phase::Waiting, _) => ("waiting", None),
                            (Phase::Backoff, None) => ("backoff", None),
                        };
                        ChannelStatus {
                            qos: ch.qos_name.clone(),
                            state: phase.into(),
                            port: st.live.as_ref().map(|l| l.flow.info().port),
                            max_sdu: st.live.as_ref().map(|l| l.flow.info().max_sdu),
                            up_s: st
                                .live
                                .as_ref()
                                .map(|l| now.duration_since(l.since).as_secs_f64()),
                            retry_in_ms,
                            last_error: st.last_error.clone(),
                            packets_out: s.packets_out.load(Relaxed),
                        }
                    })
                    .collect();
                let up = channels.iter().filter(|c| c.port.is_some()).count();
                let state = if up == channels.len() {
                    "up"
                } else if up > 0 {
                    "partial"
                } else {
                    "down"
                };
                PeerStatus {
                    name: p.cfg.name.to_string(),
                    prefixes: p.cfg.prefixes.iter().map(|x| x.to_string()).collect(),
                    allocates: p.cfg.allocates,
                    state: state.into(),
                    channels,
                    counters: p.counters.snapshot(),
                }
            })
            .collect();
        Status {
            name: self.cfg.name.to_string(),
            tun: self.tun.name().to_owned(),
            mtu: self.mtu.load(Relaxed),
            uptime_s: self.start.elapsed().as_secs_f64(),
            registered: self.registered.load(Relaxed),
            daemon_error: lock(&self.daemon_error).clone(),
            drops_no_route: self.drops_no_route.load(Relaxed),
            no_route_icmp: self.no_route_icmp.load(Relaxed),
            icmp_rate_limited: self.icmp_rate_limited.load(Relaxed),
            drops_tun_invalid: self.drops_tun_invalid.load(Relaxed),
            refused: self.refused.load(Relaxed),
            checksum_offload: self.tun.csum_offload(),
            partial_out: self.partial_out.load(Relaxed),
            partial_in: self.partial_in.load(Relaxed),
            peers,
        }
    }
}
