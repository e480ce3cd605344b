//! Systems driven by hand with explicit time, joined by an in-test wire
//! (the way quinn's tests drive a `Pair`).

use super::*;
use crate::efcp::EfcpConfig;
use crate::normal::cubes::QosCube;
use crate::normal::MembershipConfig;
use crate::rmt::{FifoConfig, QtaMuxConfig};
use std::time::Duration;

fn ms(v: u64) -> Instant {
    Instant::from_nanos(v * 1_000_000)
}

fn name(s: &str) -> AppName {
    s.parse().unwrap()
}

fn udp(i: usize) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 7000 + i as u16))
}

/// What an application of a system saw.
#[derive(Debug, Default)]
struct AppLog {
    events: Vec<AppEvent>,
    sdus: Vec<(Instant, PortId, Vec<u8>)>,
}

/// Systems whose medium 0 is a shim-udp at `udp(i)`, joined by a wire with
/// a fixed delay that can be cut.
struct Net {
    sys: Vec<System>,
    logs: Vec<AppLog>,
    wire: Vec<(Instant, usize, SocketAddr, Vec<u8>)>,
    delay: Duration,
    /// Systems whose frames are lost.
    mute: BTreeSet<usize>,
    /// Systems that are down (killed): nothing leaves them or reaches them.
    down: BTreeSet<usize>,
    /// Datagrams each system sent.
    sent: Vec<u64>,
    now: Instant,
}

impl Net {
    fn new(sys: Vec<System>) -> Self {
        let n = sys.len();
        Net {
            sys,
            logs: (0..n).map(|_| AppLog::default()).collect(),
            wire: Vec::new(),
            delay: Duration::from_millis(1),
            mute: BTreeSet::new(),
            down: BTreeSet::new(),
            sent: vec![0; n],
            now: Instant::ZERO,
        }
    }

    fn collect(&mut self) {
        for i in 0..self.sys.len() {
            while let Some(o) = self.sys[i].poll_output() {
                match o {
                    Output::ToMedium { peer, frame, .. } => {
                        self.sent[i] += 1;
                        let Some(dst) = (0..self.sys.len()).find(|&d| Some(udp(d)) == peer) else {
                            continue;
                        };
                        if !self.mute.contains(&i) && !self.down.contains(&i) {
                            self.wire
                                .push((self.now + self.delay, dst, udp(i), frame.into_vec()));
                        }
                    }
                    Output::ToApp { port, sdu } => {
                        self.logs[i].sdus.push((self.now, port, sdu.into_vec()))
                    }
                    Output::App(ev) => self.logs[i].events.push(ev),
                    Output::Membership { .. } | Output::Alarm { .. } | Output::RibRead { .. } => {}
                }
            }
        }
    }

    fn run_until(&mut self, until: Instant) {
        self.collect();
        loop {
            let next_wire = self.wire.iter().map(|w| w.0).min();
            let next_timer = self.sys.iter().filter_map(|s| s.poll_timeout()).min();
            let Some(t) = next_wire.into_iter().chain(next_timer).min() else {
                break;
            };
            if t > until {
                break;
            }
            self.now = t.max(self.now);
            let due: Vec<_> = {
                let (due, rest) = std::mem::take(&mut self.wire)
                    .into_iter()
                    .partition(|w| w.0 <= self.now);
                self.wire = rest;
                due
            };
            for (_, dst, from, frame) in due {
                if !self.down.contains(&dst) {
                    self.sys[dst].handle_frame(self.now, 0, from, &frame);
                }
            }
            for s in &mut self.sys {
                if s.poll_timeout().is_some_and(|t| t <= self.now) {
                    s.handle_timeout(self.now);
                }
            }
            self.collect();
        }
        self.now = until;
    }

    /// System `i` starts again as `sys`: a new process, nothing of the old
    /// one kept (frames on their way reach the new one).
    fn restart(&mut self, i: usize, sys: System) {
        self.sys[i] = sys;
        self.logs[i] = AppLog::default();
        self.down.remove(&i);
    }
}

fn cubes() -> Vec<QosCube> {
    vec![
        QosCube::new(1, "urgent", EfcpConfig::unreliable()).with_cell(0, 0),
        QosCube::new(2, "best-effort", EfcpConfig::unreliable()).with_cell(1, 1),
    ]
}

/// The neighbours of system `i` in a line of `n`.
fn line_peers(i: usize, n: usize) -> Vec<usize> {
    [i.checked_sub(1), Some(i + 1).filter(|&p| p < n)]
        .into_iter()
        .flatten()
        .collect()
}

/// System `i` of a line of `n`: a shim-udp whose directory reaches the
/// neighbours' normal IPCPs, and a normal IPCP `s<i>.net` (address i+1)
/// with those neighbours.
fn line_system(i: usize, n: usize, sched: &SchedulerConfig, rate: Option<PortRate>) -> System {
    let mut s = System::new(format!("s{i}"));
    let mut sc = shim_udp::Config::new("udp");
    let peers = line_peers(i, n);
    for &p in &peers {
        sc.directory.insert(name(&format!("s{p}.net")), udp(p));
        sc.directory.insert(name(&format!("app{p}")), udp(p));
    }
    s.add_shim_udp("udp", sc, rate).unwrap();
    let mut nc = NormalConfig::new("net", i as u64 + 1);
    nc.membership = Some(MembershipConfig::new(name(&format!("s{i}.net"))));
    nc.routing = Some(crate::routing::Config::default());
    nc.cubes = cubes();
    for p in 0..n {
        nc.directory.insert(name(&format!("app{p}")), p as u64 + 1);
    }
    let nbs = peers
        .iter()
        .map(|&p| NeighborSpec {
            name: name(&format!("s{p}.net")),
            over: "udp".into(),
            address: None,
        })
        .collect();
    s.add_normal(name(&format!("s{i}.net")), nc, sched, nbs, BTreeMap::new())
        .unwrap();
    s
}

fn fifo() -> SchedulerConfig {
    SchedulerConfig::Fifo(FifoConfig { queue_len: 100 })
}

fn allocated(log: &AppLog) -> Option<PortId> {
    log.events.iter().find_map(|e| match e {
        AppEvent::Allocated { port, .. } => Some(*port),
        _ => None,
    })
}

#[test]
fn two_systems_set_up_their_n1_flow_and_carry_an_application_flow() {
    let mut net = Net::new((0..2).map(|i| line_system(i, 2, &fifo(), None)).collect());
    net.sys[1].register("net", name("app1")).unwrap();
    net.run_until(ms(500));
    // The smaller name (s0.net) set the N-1 flow up; both ends have it.
    assert_eq!(net.sys[0].n1_flows().count(), 1);
    assert_eq!(net.sys[1].n1_flows().count(), 1);
    let port = net.sys[0]
        .allocate(
            net.now,
            Some("net"),
            name("app0"),
            name("app1"),
            QosSpec::default(),
        )
        .unwrap();
    net.run_until(ms(600));
    let handle = net.logs[1]
        .events
        .iter()
        .find_map(|e| match e {
            AppEvent::FlowRequest { handle, .. } => Some(*handle),
            _ => None,
        })
        .expect("the request reached the application at s1");
    let (theirs, _) = net.sys[1].accept(net.now, handle).unwrap();
    net.run_until(ms(700));
    assert_eq!(allocated(&net.logs[0]), Some(port));
    for k in 0..10u8 {
        net.sys[0].write(net.now, port, &[k; 100]).unwrap();
    }
    net.run_until(ms(800));
    let got: Vec<u8> = net.logs[1]
        .sdus
        .iter()
        .filter(|(_, p, _)| *p == theirs)
        .map(|(_, _, s)| s[0])
        .collect();
    assert_eq!(got, (0..10).collect::<Vec<u8>>());
}

#[test]
fn a_normal_members_rib_shows_its_neighbours_and_their_n1_flows() {
    let mut net = Net::new((0..2).map(|i| line_system(i, 2, &fifo(), None)).collect());
    let neighbour = |net: &Net| {
        let rib = net.sys[0].normal_rib(1).expect("member 1 is normal");
        match rib
            .get("/difm/enr/neighs/pn=s1.net")
            .map(|o| o.value.clone())
        {
            Some(crate::rib::ObjValue::Str(s)) => s,
            other => panic!("no Neighbor object: {other:?}"),
        }
    };
    let before = neighbour(&net);
    assert!(
        before.starts_with("address from hellos, over DIF udp, "),
        "{before}"
    );
    assert!(!before.contains("up on"), "{before}");
    net.run_until(ms(500));
    let port = net.sys[0].n1_flows().next().unwrap().0;
    assert_eq!(
        neighbour(&net),
        format!("address from hellos, over DIF udp, up on N-1 port {port}")
    );
    assert!(net.sys[0].normal_rib(0).is_none(), "member 0 is the shim");
}

#[test]
fn the_allocator_retries_every_second_until_the_neighbour_answers() {
    let mut net = Net::new((0..2).map(|i| line_system(i, 2, &fifo(), None)).collect());
    // s1 is deaf for 3.5 s: s0 asks, times out and asks again.
    net.mute.insert(1);
    net.run_until(ms(3500));
    assert_eq!(net.sys[0].n1_flows().count(), 0);
    assert_eq!(
        net.sys[1].n1_flows().count(),
        1,
        "s1 accepted every request"
    );
    let asked = net.sent[0];
    assert!(asked >= 4, "s0 sent only {asked} datagrams in 3.5 s");
    // s1 never sets the flow up itself: its name is the larger.
    assert!(net.sys[1].n1_pending.is_empty());
    net.mute.clear();
    net.run_until(ms(6000));
    assert_eq!(net.sys[0].n1_flows().count(), 1);
    assert_eq!(
        net.sys[1].n1_flows().count(),
        1,
        "the old flow was replaced"
    );
}

#[test]
fn a_silent_neighbour_has_its_n1_flow_torn_down_and_set_up_again() {
    let mut net = Net::new((0..2).map(|i| line_system(i, 2, &fifo(), None)).collect());
    net.run_until(ms(1000));
    let first = net.sys[0].n1_flows().next().unwrap().0;
    net.mute.insert(1);
    net.run_until(ms(10_000));
    assert!(
        net.sys[0].counters().n1_silent >= 1,
        "{:?}",
        net.sys[0].counters()
    );
    net.mute.clear();
    net.run_until(ms(15_000));
    let again = net.sys[0].n1_flows().next().unwrap().0;
    assert_ne!(first, again, "a fresh N-1 flow");
}

#[test]
fn a_blocked_medium_holds_pdus_in_the_rmt_until_it_is_writable() {
    let mut net = Net::new((0..2).map(|i| line_system(i, 2, &fifo(), None)).collect());
    net.sys[1].register("net", name("app1")).unwrap();
    net.run_until(ms(500));
    let port = net.sys[0]
        .allocate(
            net.now,
            Some("net"),
            name("app0"),
            name("app1"),
            QosSpec::default(),
        )
        .unwrap();
    net.run_until(ms(510));
    let handle = match net.logs[1].events.last() {
        Some(AppEvent::FlowRequest { handle, .. }) => *handle,
        e => panic!("{e:?}"),
    };
    net.sys[1].accept(net.now, handle).unwrap();
    net.run_until(ms(600));
    net.sys[0].medium_blocked(net.now, 0);
    let before = net.sent[0];
    for _ in 0..20 {
        net.sys[0].write(net.now, port, &[7; 500]).unwrap();
    }
    net.collect();
    assert_eq!(net.sent[0], before, "nothing reached the blocked medium");
    let n = net.sys[0].member(1).unwrap().normal().unwrap();
    let queued: usize = n
        .rmt()
        .ports()
        .flat_map(|p| n.rmt().queue_stats(p))
        .map(|q| q.queued)
        .sum();
    assert_eq!(queued, 20, "the PDUs wait in the RMT");
    net.sys[0].medium_writable(net.now, 0);
    net.collect();
    assert_eq!(net.sent[0], before + 20);
}

#[test]
fn behind_a_paced_shim_qta_mux_keeps_the_urgent_cube_fast() {
    // 10 Mb/s, urgent 1 Mb/s + best effort 12 Mb/s offered.
    let rate = PortRate::new(10_000_000);
    let run = |sched: SchedulerConfig| -> (f64, f64, usize, usize) {
        let (mut net, ports) = urgent_and_best_effort_flows(&sched, Some(rate));
        let (start, mut t) = (net.now, net.now);
        let mut sent = [0usize; 2];
        let mut k = 0u64;
        while t < start + Duration::from_secs(2) {
            // Every 0.5 ms: a best-effort SDU from 6 in 8 slots, an urgent
            // one every 16 slots (1000 bytes each).
            let urgent = k.is_multiple_of(16);
            let be = k % 8 < 6;
            for (c, on) in [(0usize, urgent), (1, be)] {
                if on {
                    let mut sdu = vec![c as u8; 1000];
                    sdu[1..9].copy_from_slice(&t.as_nanos().to_be_bytes());
                    net.sys[0].write(t, ports[c], &sdu).unwrap();
                    sent[c] += 1;
                }
            }
            k += 1;
            t = t + Duration::from_micros(500);
            net.run_until(t);
        }
        net.run_until(t + Duration::from_secs(1));
        let mut delay = [0f64; 2];
        let mut got = [0usize; 2];
        for (at, _, sdu) in &net.logs[1].sdus {
            let c = sdu[0] as usize;
            let sent_at = u64::from_be_bytes(sdu[1..9].try_into().unwrap());
            delay[c] += (at.as_nanos() - sent_at) as f64 / 1e6;
            got[c] += 1;
        }
        (
            delay[0] / got[0] as f64,
            delay[1] / got[1] as f64,
            sent[0] - got[0],
            sent[1] - got[1],
        )
    };
    let (u, b, ulost, blost) = run(SchedulerConfig::QtaMux(QtaMuxConfig::new(vec![100, 60])));
    assert!(
        u < 3.0 * 1.9,
        "urgent {u} ms (unloaded: 1 ms wire + 0.8 ms on the link)"
    );
    assert_eq!(ulost, 0);
    assert!(b > 20.0 && blost > 100, "best effort {b} ms, {blost} lost");
    let (u, b, ..) = run(fifo());
    assert!(
        u > 20.0 && (u / b - 1.0).abs() < 0.2,
        "FIFO: urgent {u} ms, best effort {b} ms"
    );
}

/// Two systems with an application flow across their normal DIF, at
/// 700 ms: (net, port at s0, port at s1).
fn flow_across() -> (Net, PortId, PortId) {
    let mut net = Net::new((0..2).map(|i| line_system(i, 2, &fifo(), None)).collect());
    net.sys[1].register("net", name("app1")).unwrap();
    net.run_until(ms(500));
    let (port, theirs) = open_app_flow(&mut net);
    (net, port, theirs)
}

/// Opens an application flow from app0 at s0 to app1 (registered at s1),
/// accepted by s1, in 200 ms: (port at s0, port at s1).
fn open_app_flow(net: &mut Net) -> (PortId, PortId) {
    open_app_flow_in(net, "net")
}

/// [`open_app_flow`] in DIF `dif`.
fn open_app_flow_in(net: &mut Net, dif: &str) -> (PortId, PortId) {
    let t = net.now;
    let port = net.sys[0]
        .allocate(
            net.now,
            Some(dif),
            name("app0"),
            name("app1"),
            QosSpec::default(),
        )
        .unwrap();
    net.run_until(t + Duration::from_millis(100));
    let handle = net.logs[1]
        .events
        .iter()
        .find_map(|e| match e {
            AppEvent::FlowRequest { handle, .. } => Some(*handle),
            _ => None,
        })
        .expect("the request reached app1");
    let (theirs, _) = net.sys[1].accept(net.now, handle).unwrap();
    net.run_until(t + Duration::from_millis(200));
    assert_eq!(allocated(&net.logs[0]), Some(port));
    (port, theirs)
}

fn deallocated(log: &AppLog, port: PortId) -> bool {
    log.events.contains(&AppEvent::Deallocated { port })
}

#[test]
fn removing_a_normal_ipcp_closes_its_flows_at_both_ends_and_frees_its_name() {
    let (mut net, ours, theirs) = flow_across();
    let t = net.now;
    let r = net.sys[1].remove_ipcp(t, 1).unwrap();
    assert_eq!(r.app_flows, vec![theirs]);
    assert_eq!(r.n1_below.len(), 1, "{r:?}");
    assert_eq!(r.names, vec![name("app1")]);
    assert!(net.sys[1].is_removed(1));
    assert_eq!(net.sys[1].member_in("net"), None);
    assert_eq!(net.sys[1].n1_flows().count(), 0);
    assert!(!net.sys[1].is_ipcp_name(0, &name("s1.net")));
    net.collect();
    assert!(
        deallocated(&net.logs[1], theirs),
        "the local application is told at once"
    );
    // The peer application hears of it within 100 ms (the deallocation
    // went out before the N-1 flow below was torn down).
    net.run_until(t + Duration::from_millis(100));
    assert!(deallocated(&net.logs[0], ours), "{:?}", net.logs[0].events);
    assert_eq!(
        net.sys[1].remove_ipcp(net.now, 1),
        Err(SystemError::NoMember(1))
    );
    assert!(net.sys[1].register("net", name("app1")).is_err());
    // The name and DIF may be used again: a new member, a new index, and
    // the N-1 flow to s0 comes back.
    let mut nc = NormalConfig::new("net", 2);
    nc.membership = Some(MembershipConfig::new(name("s1.net")));
    nc.routing = Some(crate::routing::Config::default());
    nc.cubes = cubes();
    let nb = NeighborSpec {
        name: name("s0.net"),
        over: "udp".into(),
        address: None,
    };
    let j = net.sys[1]
        .add_normal(name("s1.net"), nc, &fifo(), vec![nb], BTreeMap::new())
        .unwrap();
    assert_eq!(j, 2);
    net.run_until(t + Duration::from_secs(6));
    assert_eq!(net.sys[1].n1_flows().count(), 1);
}

#[test]
fn removing_a_shim_tears_down_the_n1_flows_and_neighbours_above_it() {
    let (mut net, ours, _) = flow_across();
    let t = net.now;
    let r = net.sys[0].remove_ipcp(t, 0).unwrap();
    assert_eq!(r.n1_above.len(), 1, "{r:?}");
    assert_eq!(r.neighbors_above, vec![(1, name("s1.net"))]);
    assert!(r.app_flows.is_empty());
    assert_eq!(net.sys[0].n1_flows().count(), 0);
    assert!(net.sys[0].plan(1).unwrap().neighbors.is_empty());
    // Nothing is set up over the removed shim again, and no frame leaves
    // after those of the removal itself (the deallocation notice).
    net.collect();
    let sent = net.sent[0];
    net.run_until(t + Duration::from_secs(10));
    assert_eq!(net.sys[0].n1_flows().count(), 0);
    // The normal IPCP's application flow fails once the route is gone
    // (its destination has had no route for 6 s).
    assert!(deallocated(&net.logs[0], ours), "{:?}", net.logs[0].events);
    assert_eq!(net.sent[0], sent, "the removed shim sent frames");
}

/// System `i`: a shim-udp at `udp(i)` reaching `peers` (system index,
/// normal IPCP name), and a normal IPCP `me` at `addr` in a DIF with
/// `password`, its neighbours those peers.
fn member_system(i: usize, me: &str, addr: u64, password: &str, peers: &[(usize, &str)]) -> System {
    let mut s = System::new(format!("s{i}"));
    let mut sc = shim_udp::Config::new("udp");
    for &(p, n) in peers {
        sc.directory.insert(name(n), udp(p));
    }
    s.add_shim_udp("udp", sc, None).unwrap();
    let mut nc = NormalConfig::new("net", addr);
    let mut m = MembershipConfig::new(name(me));
    m.password = Some(password.into());
    m.entropy = [i as u8 + 1; 32];
    nc.membership = Some(m);
    nc.routing = Some(crate::routing::Config::default());
    nc.directory.insert(name("app0"), 1);
    nc.directory.insert(name("app1"), 2);
    let nbs = peers
        .iter()
        .map(|&(_, n)| NeighborSpec {
            name: name(n),
            over: "udp".into(),
            address: None,
        })
        .collect();
    s.add_normal(name(me), nc, &fifo(), nbs, BTreeMap::new())
        .unwrap();
    s
}

/// Writes an SDU on `port` of system 0 every 50 ms until `until`.
fn stream(net: &mut Net, port: PortId, until: u64, next: &mut u32) {
    let mut t = net.now;
    while t < ms(until) {
        if net.sys[0].write(net.now, port, &[*next as u8; 64]).is_ok() {
            *next += 1;
        }
        t = t + Duration::from_millis(50);
        net.run_until(t);
    }
}

#[test]
fn a_flow_claiming_an_authenticated_neighbour_waits_until_the_claimant_authenticates() {
    const PW: &str = "the DIF's password";
    let mut net = Net::new(vec![
        member_system(0, "s0.net", 1, PW, &[(1, "s1.net")]),
        member_system(1, "s1.net", 2, PW, &[(0, "s0.net")]),
        // Someone else on the medium, using s0's name and address, without
        // the password.
        member_system(2, "s0.net", 1, "a guess", &[(1, "s1.net")]),
    ]);
    net.mute.insert(2);
    net.sys[1].register("net", name("app1")).unwrap();
    net.run_until(ms(2000));
    let (port, theirs) = open_app_flow(&mut net);
    let working: Vec<PortId> = net.sys[1].n1_flows().map(|f| f.0).collect();
    assert_eq!(working.len(), 1);

    // The impostor speaks: its N-1 flow claims s0.net at s1, again and
    // again, and never authenticates.
    net.mute.clear();
    let mut next = 0u32;
    stream(&mut net, port, 25_000, &mut next);
    let c = net.sys[1].counters();
    assert!(c.n1_claims >= 2, "{c:?}");
    assert!(c.n1_claims_refused >= 1, "{c:?}");
    assert_eq!(c.n1_claims_admitted, 0, "{c:?}");
    let now_working: Vec<PortId> = net.sys[1]
        .n1_flows()
        .map(|f| f.0)
        .filter(|p| !net.sys[1].claims.contains_key(p))
        .collect();
    assert_eq!(now_working, working, "the working N-1 flow stayed");
    let got: Vec<u8> = net.logs[1]
        .sdus
        .iter()
        .filter(|(_, p, _)| *p == theirs)
        .map(|(_, _, s)| s[0])
        .collect();
    assert_eq!(got.len(), next as usize, "every SDU arrived meanwhile");
    assert!(
        net.logs[0]
            .events
            .iter()
            .all(|e| !matches!(e, AppEvent::Deallocated { .. })),
        "the application flow never broke"
    );

    // The real s0 comes back from another address (the impostor's slot):
    // its N-1 flow is a claim too, and takes the neighbour over once it
    // authenticates.
    net.mute.clear();
    net.mute.insert(0);
    net.sys[2] = member_system(2, "s0.net", 1, PW, &[(1, "s1.net")]);
    net.run_until(ms(32_000));
    let c = net.sys[1].counters();
    assert!(c.n1_claims_admitted >= 1, "{c:?}");
    let after: Vec<PortId> = net.sys[1]
        .n1_flows()
        .map(|f| f.0)
        .filter(|p| !net.sys[1].claims.contains_key(p))
        .collect();
    assert_eq!(after.len(), 1);
    assert_ne!(after, working, "the returning neighbour's flow took over");
    assert!(net.sys[1].claims.is_empty());
}

/// System `i` of a two-level stack for the lane tests: a shim-udp reaching
/// `peers` (system index, name of their `low` IPCP); a normal IPCP
/// `low_name` (address `low_addr`, no password) in DIF `low` with those
/// peers as neighbours, whose static directory puts `s0.up` at 1 and
/// `s1.up` at 2; and a normal IPCP `up_name` (address `up_addr`) in DIF
/// `up` with `password`, over `low`, neighbour of `up_peer`, whose two
/// cubes ride on low's two cubes: a primary N-1 flow and a lane.
fn stacked_system(
    i: usize,
    peers: &[(usize, &str)],
    low: (&str, u64),
    up: (&str, u64),
    up_peer: &str,
    password: &str,
) -> System {
    stacked_system_tuned(i, peers, low, up, (up_peer, password), |_| {})
}

/// [`stacked_system`] with the upper IPCP's membership changed by `tune`.
fn stacked_system_tuned(
    i: usize,
    peers: &[(usize, &str)],
    (low_name, low_addr): (&str, u64),
    (up_name, up_addr): (&str, u64),
    (up_peer, password): (&str, &str),
    tune: impl FnOnce(&mut MembershipConfig),
) -> System {
    let mut s = System::new(format!("s{i}"));
    let mut sc = shim_udp::Config::new("udp");
    for &(p, n) in peers {
        sc.directory.insert(name(n), udp(p));
    }
    s.add_shim_udp("udp", sc, None).unwrap();
    let mut low = NormalConfig::new("low", low_addr);
    low.membership = Some(MembershipConfig::new(name(low_name)));
    low.routing = Some(crate::routing::Config::default());
    low.cubes = cubes();
    low.directory.insert(name("s0.up"), 1);
    low.directory.insert(name("s1.up"), 2);
    let nbs = peers
        .iter()
        .map(|&(_, n)| NeighborSpec {
            name: name(n),
            over: "udp".into(),
            address: None,
        })
        .collect();
    s.add_normal(name(low_name), low, &fifo(), nbs, BTreeMap::new())
        .unwrap();
    let mut up = NormalConfig::new("up", up_addr);
    up.directory.insert(name("app1"), 2);
    let mut m = MembershipConfig::new(name(up_name));
    m.password = Some(password.into());
    m.entropy = [i as u8 + 7; 32];
    tune(&mut m);
    up.membership = Some(m);
    up.routing = Some(crate::routing::Config::default());
    up.cubes = cubes();
    for (c, lower) in up.cubes.iter_mut().zip(["urgent", "best-effort"]) {
        c.lower.insert("low".into(), lower.into());
    }
    let nb = NeighborSpec {
        name: name(up_peer),
        over: "low".into(),
        address: None,
    };
    s.add_normal(name(up_name), up, &fifo(), vec![nb], BTreeMap::new())
        .unwrap();
    s
}

/// The lanes of the N-1 flows of system `i`'s upper IPCP (member 2).
fn upper_lanes(net: &Net, i: usize) -> Vec<(PortId, crate::rmt::Lane)> {
    let n = net.sys[i].member(2).and_then(|m| m.normal()).unwrap();
    n.rmt().lanes().map(|(p, l)| (p, l.clone())).collect()
}

#[test]
fn a_lane_in_an_authenticated_neighbours_name_from_another_peer_is_refused() {
    const PW: &str = "the upper DIF's password";
    let mut net = Net::new(vec![
        stacked_system(
            0,
            &[(1, "s1.low")],
            ("s0.low", 1),
            ("s0.up", 1),
            "s1.up",
            PW,
        ),
        stacked_system(
            1,
            &[(0, "s0.low"), (2, "s2.low")],
            ("s1.low", 2),
            ("s1.up", 2),
            "s0.up",
            PW,
        ),
        // A member of the lower DIF that uses s0's name in the upper one,
        // without its password.
        stacked_system(
            2,
            &[(1, "s1.low")],
            ("s2.low", 3),
            ("s0.up", 1),
            "s1.up",
            "a guess",
        ),
    ]);
    net.mute.insert(2);
    net.run_until(ms(6000));
    let lanes = upper_lanes(&net, 1);
    assert_eq!(lanes.len(), 1, "s0's primary and lane are up: {lanes:?}");
    let (lane, _) = lanes[0];

    // The impostor speaks: its N-1 flows in s0.up's name reach s1 over the
    // lower DIF, a primary (held as a claim, never admitted) and a lane.
    net.mute.clear();
    net.run_until(ms(20_000));
    let after = upper_lanes(&net, 1);
    assert_eq!(after.len(), 1, "{after:?}");
    assert_eq!(after[0].0, lane, "s0's lane stayed");
    let c = net.sys[1].counters();
    assert!(c.n1_claims >= 1, "{c:?}");
    assert_eq!(c.n1_claims_admitted, 0, "{c:?}");
    assert!(c.n1_lanes_refused >= 1, "{c:?}");
}

/// Writes `sdu` on `port` of system 0 and returns the frames it put on its
/// medium and what the buffers cost meanwhile.
fn frames_of_one_write(
    net: &mut Net,
    port: PortId,
    sdu: &[u8],
) -> (Vec<PduBuf>, crate::buf::BufStats) {
    net.collect();
    let before = crate::buf::stats();
    net.sys[0].write(net.now, port, sdu).unwrap();
    let mut frames = Vec::new();
    while let Some(o) = net.sys[0].poll_output() {
        if let Output::ToMedium { frame, .. } = o {
            frames.push(frame);
        }
    }
    let after = crate::buf::stats();
    let cost = crate::buf::BufStats {
        made: after.made - before.made,
        copies: after.copies - before.copies,
        grown: after.grown - before.grown,
    };
    (frames, cost)
}

#[test]
fn an_sdu_is_copied_once_down_and_once_up_a_normal_dif() {
    let (mut net, port, _) = flow_across();
    let sdu = [0x5a; 1000];
    let (frames, cost) = frames_of_one_write(&mut net, port, &sdu);
    assert_eq!(frames.len(), 1, "{frames:?}");
    assert!(frames[0].ends_with(&sdu));
    // One buffer, the SDU copied into it once: the delimiter, PCI and the
    // shim's header went into its room in front.
    assert_eq!((cost.made, cost.copies, cost.grown), (1, 1, 0), "{cost:?}");

    // On the way up, the frame is copied once out of the receive buffer
    // and the payload handed to the application in that copy.
    let before = crate::buf::stats();
    net.sys[1].handle_frame(net.now, 0, udp(0), &frames[0]);
    let mut got = Vec::new();
    while let Some(o) = net.sys[1].poll_output() {
        if let Output::ToApp { sdu, .. } = o {
            got.push(sdu);
        }
    }
    let after = crate::buf::stats();
    assert_eq!(got, vec![PduBuf::from(sdu.to_vec())]);
    assert_eq!(
        (after.made - before.made, after.copies - before.copies),
        (1, 1)
    );
}

/// An SDU that is not a slice: its bytes made on demand, as a ring's
/// record is read in place; `broken` gives none.
struct Pattern {
    len: usize,
    broken: bool,
}

impl Pattern {
    fn byte(i: usize) -> u8 {
        (i * 7 % 251) as u8
    }
}

impl SduSource for Pattern {
    fn len(&self) -> usize {
        self.len
    }

    fn append_to(&self, at: usize, n: usize, out: &mut Vec<u8>) -> bool {
        if self.broken || at + n > self.len {
            return false;
        }
        out.extend((at..at + n).map(Pattern::byte));
        true
    }
}

#[test]
fn an_sdu_from_a_source_is_copied_once_from_it_into_each_pdu() {
    let (mut net, port, _) = flow_across();
    net.collect();
    let src = Pattern {
        len: 20_000,
        broken: false,
    };
    let before = crate::buf::stats();
    net.sys[0].write_from(net.now, port, &src).unwrap();
    let mut frames = Vec::new();
    while let Some(o) = net.sys[0].poll_output() {
        if let Output::ToMedium { frame, .. } = o {
            frames.push(frame);
        }
    }
    let after = crate::buf::stats();
    // Fragmented: each fragment copied once, from the source into its
    // PDU's buffer, and nothing else.
    assert!(frames.len() >= 3, "{} frames", frames.len());
    let n = frames.len() as u64;
    assert_eq!(
        (after.made - before.made, after.copies - before.copies),
        (n, n)
    );
    let mut got = Vec::new();
    for f in &frames {
        net.sys[1].handle_frame(net.now, 0, udp(0), f);
    }
    while let Some(o) = net.sys[1].poll_output() {
        if let Output::ToApp { sdu, .. } = o {
            got.push(sdu);
        }
    }
    let want: Vec<u8> = (0..src.len).map(Pattern::byte).collect();
    assert_eq!(got, vec![PduBuf::from(want)]);

    // A source that cannot give its bytes sends nothing.
    let broken = Pattern {
        len: 20_000,
        broken: true,
    };
    let e = net.sys[0].write_from(net.now, port, &broken).unwrap_err();
    assert!(
        matches!(&e, FlowError::Invalid(m) if m.contains("could not be read")),
        "{e:?}"
    );
    let mut sent = 0;
    while let Some(o) = net.sys[0].poll_output() {
        sent += usize::from(matches!(o, Output::ToMedium { .. }));
    }
    assert_eq!(sent, 0);
}

/// Two systems with DIF `up` stacked on DIF `low`, enrolled (at 6 s).
fn stacked_pair() -> Net {
    const PW: &str = "pw";
    let mut net = Net::new(vec![
        stacked_system(
            0,
            &[(1, "s1.low")],
            ("s0.low", 1),
            ("s0.up", 1),
            "s1.up",
            PW,
        ),
        stacked_system(
            1,
            &[(0, "s0.low")],
            ("s1.low", 2),
            ("s1.up", 2),
            "s0.up",
            PW,
        ),
    ]);
    net.run_until(ms(6000));
    net
}

/// [`stacked_pair`] with an application flow across `up`: its port at
/// system 0 and at system 1.
fn flow_across_stacked() -> (Net, PortId, PortId) {
    let mut net = stacked_pair();
    net.sys[1].register("up", name("app1")).unwrap();
    let (port, theirs) = open_app_flow_in(&mut net, "up");
    (net, port, theirs)
}

#[test]
fn an_sdu_is_copied_once_down_and_once_up_two_stacked_difs() {
    let (mut net, port, theirs) = flow_across_stacked();

    let sdu = [0xa5; 1000];
    let (frames, cost) = frames_of_one_write(&mut net, port, &sdu);
    assert_eq!(frames.len(), 1, "{frames:?}");
    assert!(frames[0].ends_with(&sdu));
    // The upper DIF's frame is the lower DIF's SDU in the same buffer.
    assert_eq!((cost.made, cost.copies, cost.grown), (1, 1, 0), "{cost:?}");

    // On the way up, the lower DIF's frame is copied once out of the
    // receive buffer; the upper DIF takes its frame in that buffer and
    // hands the payload to the application in it.
    let before = crate::buf::stats();
    for f in frames {
        net.sys[1].handle_frame(net.now, 0, udp(0), &f);
    }
    let mut got = Vec::new();
    while let Some(o) = net.sys[1].poll_output() {
        if let Output::ToApp { port, sdu } = o {
            got.push((port, sdu));
        }
    }
    let after = crate::buf::stats();
    assert_eq!(got, vec![(theirs, Sdu::from(sdu.to_vec()))]);
    assert_eq!(
        (after.made - before.made, after.copies - before.copies),
        (1, 1)
    );
}

/// Every output `sys` has now.
fn outputs(sys: &mut System) -> Vec<Output> {
    std::iter::from_fn(|| sys.poll_output()).collect()
}

/// The SDUs for applications among `outs`, with their ports.
fn to_apps(outs: Vec<Output>) -> Vec<(PortId, Sdu)> {
    outs.into_iter()
        .filter_map(|o| match o {
            Output::ToApp { port, sdu } => Some((port, sdu)),
            _ => None,
        })
        .collect()
}

#[test]
fn frames_received_held_reach_the_application_in_order_when_the_system_settles() {
    let (mut net, port, theirs) = flow_across_stacked();
    let sdus: Vec<Vec<u8>> = (0..20u8).map(|i| vec![i; 300 + usize::from(i)]).collect();
    let mut frames = Vec::new();
    for sdu in &sdus {
        frames.extend(frames_of_one_write(&mut net, port, sdu).0);
    }
    assert_eq!(frames.len(), sdus.len());
    let before = crate::buf::stats();
    for f in &frames {
        let rx = Rx::Udp {
            from: udp(0),
            datagram: f,
        };
        assert!(net.sys[1].receive_held(net.now, 0, rx).is_none());
    }
    // Held: the lower DIF took the frames, the upper one has not yet.
    let early = outputs(&mut net.sys[1]);
    assert!(
        !early.iter().any(|o| matches!(o, Output::ToApp { .. })),
        "{early:?}"
    );
    net.sys[1].settle(net.now);
    let got = to_apps(outputs(&mut net.sys[1]));
    let want: Vec<_> = sdus
        .iter()
        .map(|s| (theirs, Sdu::from(s.clone())))
        .collect();
    assert_eq!(got, want);
    // Still one copy per SDU on the way up.
    let after = crate::buf::stats();
    assert_eq!(after.copies - before.copies, sdus.len() as u64);
}

#[test]
fn sdus_written_held_go_down_in_order_when_the_system_settles() {
    let (mut net, port, theirs) = flow_across_stacked();
    let sdus: Vec<Vec<u8>> = (0..20u8).map(|i| vec![i; 300 + usize::from(i)]).collect();
    net.collect();
    let before = crate::buf::stats();
    for sdu in &sdus {
        net.sys[0].write_held(net.now, port, sdu).unwrap();
    }
    // Held: the upper DIF took the SDUs; nothing has reached the medium.
    let early = outputs(&mut net.sys[0]);
    assert!(
        !early.iter().any(|o| matches!(o, Output::ToMedium { .. })),
        "{early:?}"
    );
    net.sys[0].settle(net.now);
    let frames: Vec<PduBuf> = outputs(&mut net.sys[0])
        .into_iter()
        .filter_map(|o| match o {
            Output::ToMedium { frame, .. } => Some(frame),
            _ => None,
        })
        .collect();
    // One frame and one copy per SDU, as written one by one.
    assert_eq!(frames.len(), sdus.len());
    assert_eq!(
        crate::buf::stats().copies - before.copies,
        sdus.len() as u64
    );
    for f in &frames {
        net.sys[1].handle_frame(net.now, 0, udp(0), f);
    }
    let want: Vec<_> = sdus
        .iter()
        .map(|s| (theirs, Sdu::from(s.clone())))
        .collect();
    assert_eq!(to_apps(outputs(&mut net.sys[1])), want);
    // A held write on a flow that does not exist is refused as write is.
    assert!(matches!(
        net.sys[0].write_held(net.now, 9999, b"x"),
        Err(FlowError::UnknownFlow(_))
    ));
}

/// Two flows across a DIF whose RMT schedules with `sched` (its shims paced
/// at `rate`), one in the urgent cube and one in best effort: (net,
/// [urgent port, best-effort port]) at s0, app1 registered at s1.
fn urgent_and_best_effort_flows(
    sched: &SchedulerConfig,
    rate: Option<PortRate>,
) -> (Net, [PortId; 2]) {
    let mut net = Net::new((0..2).map(|i| line_system(i, 2, sched, rate)).collect());
    net.sys[1].register("net", name("app1")).unwrap();
    net.run_until(ms(500));
    let mut ports = Vec::new();
    for cube in [1u64, 2] {
        let qos = QosSpec {
            cube: Some(cube),
            ..Default::default()
        };
        ports.push(
            net.sys[0]
                .allocate(net.now, Some("net"), name("app0"), name("app1"), qos)
                .unwrap(),
        );
        net.run_until(net.now + Duration::from_millis(20));
        let handle = match net.logs[1].events.last() {
            Some(AppEvent::FlowRequest { handle, .. }) => *handle,
            e => panic!("{e:?}"),
        };
        net.sys[1].accept(net.now, handle).unwrap();
        net.run_until(net.now + Duration::from_millis(20));
    }
    (net, [ports[0], ports[1]])
}

/// Writes, held, four best-effort SDUs and then an urgent one, settles,
/// and returns the first bytes of the SDUs in the order s1 received them.
fn arrival_order_of_a_held_batch(net: &mut Net, ports: [PortId; 2]) -> Vec<u8> {
    let before = net.logs[1].sdus.len();
    let t = net.now;
    for k in 0..4u8 {
        net.sys[0].write_held(t, ports[1], &[b'b', k]).unwrap();
    }
    net.sys[0].write_held(t, ports[0], b"u").unwrap();
    net.sys[0].settle(t);
    net.run_until(t + Duration::from_millis(20));
    net.logs[1].sdus[before..]
        .iter()
        .map(|(_, _, s)| s[0])
        .collect()
}

#[test]
fn a_held_batch_reaches_the_rmt_whole_so_its_scheduler_orders_it() {
    // A system's normal IPCP flushes once per batch: the RMT holds the
    // turn's five PDUs together, and QTA-Mux sends the urgent one first.
    let sched = SchedulerConfig::QtaMux(QtaMuxConfig::new(vec![100, 60]));
    let (mut net, ports) = urgent_and_best_effort_flows(&sched, None);
    assert_eq!(
        arrival_order_of_a_held_batch(&mut net, ports),
        b"ubbbb",
        "the urgent SDU, written last, leaves first"
    );
    // Flushed per SDU, each PDU left before the next was written: the
    // scheduler never had a choice.
    let (mut net, ports) = urgent_and_best_effort_flows(&sched, None);
    let t = net.now;
    net.sys[0].with_machine(t, 1, |m| match m {
        Machine::Normal(n) => n.set_batched_flush(false),
        _ => panic!("member 1 is the normal IPCP"),
    });
    assert_eq!(arrival_order_of_a_held_batch(&mut net, ports), b"bbbbu");
}

#[test]
fn a_flow_with_no_dif_named_goes_to_a_normal_dif_that_knows_the_name_before_a_shim() {
    // The shim-hv IPCP comes first and claims to reach every name.
    let mut s = System::new("s");
    s.add_shim_hv(
        "hv",
        crate::shim_hv::Config::new("hv", crate::shim_hv::Side::Host),
        None,
    )
    .unwrap();
    let mut nc = NormalConfig::new("net", 1);
    nc.membership = Some(MembershipConfig::new(name("s.net")));
    nc.directory.insert(name("app"), 2);
    s.add_normal(name("s.net"), nc, &fifo(), Vec::new(), BTreeMap::new())
        .unwrap();
    assert_eq!(s.member_for(&name("app")), Some(1));
    // A name no normal DIF knows goes to the shim.
    assert_eq!(s.member_for(&name("other")), Some(0));
}

/// A flow whose application closed it while the driver held SDUs the
/// flow could not take ([`System::app_closed`]) stays open for them, and
/// writable, until [`LINGER_MAX`] has passed; then the system closes it
/// itself, at both ends, counts it and tells the driver. Before, nothing
/// in the system knew of such a close: a driver that waited for the
/// window kept the flow for as long as the window stayed shut.
#[test]
fn a_flow_closed_by_its_application_with_sdus_held_goes_after_linger_max() {
    let (mut net, port, theirs) = flow_across();
    let t = net.now;
    net.sys[0].app_closed(t, port);
    net.run_until(t + (LINGER_MAX - Duration::from_secs(1)));
    assert!(!deallocated(&net.logs[0], port), "closed early");
    let now = net.now;
    assert_eq!(net.sys[0].write(now, port, b"still going"), Ok(()));
    // A second call does not put the end off.
    net.sys[0].app_closed(now, port);
    net.run_until(t + LINGER_MAX + Duration::from_secs(1));
    assert!(deallocated(&net.logs[0], port), "still open");
    assert!(deallocated(&net.logs[1], theirs), "the peer was not told");
    assert_eq!(net.sys[0].counters().app_close_expired, 1);
    let now = net.now;
    assert_eq!(
        net.sys[0].write(now, port, b"late"),
        Err(FlowError::UnknownFlow(port.into()))
    );
}

/// A flow the driver closes ([`System::close`]) after
/// [`System::app_closed`] is no longer the system's to close: no second
/// deallocation reaches the driver, nothing is counted.
#[test]
fn a_flow_closed_after_app_closed_is_not_closed_again() {
    let (mut net, port, theirs) = flow_across();
    let t = net.now;
    net.sys[0].app_closed(t, port);
    net.run_until(t + Duration::from_secs(1));
    let now = net.now;
    net.sys[0].close(now, port);
    net.run_until(t + LINGER_MAX + Duration::from_secs(1));
    assert!(deallocated(&net.logs[1], theirs), "the peer was not told");
    assert!(
        !deallocated(&net.logs[0], port),
        "the system reported a flow the driver closed"
    );
    assert_eq!(net.sys[0].counters().app_close_expired, 0);
}

mod n1_failures;
mod neighbors;

// ---- flows ended by their peer, kept for their application -------------

fn holds_expired(log: &AppLog, port: PortId) -> usize {
    log.events
        .iter()
        .filter(|e| **e == AppEvent::HoldExpired { port })
        .count()
}

/// A flow its peer ended, kept for its application, keeps its port
/// (a new flow gets another even when the counter comes round to it),
/// and is reported once, [`ENDED_HOLD_MAX`] later, and counted.
#[test]
fn an_ended_flow_kept_for_its_application_keeps_its_port_until_its_time_is_over() {
    let (mut net, port, theirs) = flow_across();
    let t = net.now;
    net.sys[1].close(t, theirs);
    net.run_until(t + Duration::from_millis(200));
    assert!(deallocated(&net.logs[0], port), "the peer's close came");
    let now = net.now;
    assert!(net.sys[0].hold_ended(now, port));
    assert!(!net.sys[0].hold_ended(now, port), "kept twice");
    assert!(net.sys[0].is_held_ended(port));
    assert!(net.sys[0]
        .poll_timeout()
        .is_some_and(|d| d <= now + ENDED_HOLD_MAX));

    // The port counter comes round to the kept port: it is passed over.
    net.sys[0].next_port = port;
    let other = net.sys[0]
        .allocate(
            now,
            Some("net"),
            name("app0"),
            name("app1"),
            QosSpec::default(),
        )
        .unwrap();
    assert_ne!(other, port);

    net.run_until(now + (ENDED_HOLD_MAX - Duration::from_secs(1)));
    assert_eq!(holds_expired(&net.logs[0], port), 0, "reported early");
    net.run_until(now + ENDED_HOLD_MAX + Duration::from_secs(1));
    assert_eq!(holds_expired(&net.logs[0], port), 1);
    assert_eq!(net.sys[0].counters().ended_hold_expired, 1);
    assert!(!net.sys[0].is_held_ended(port));
    net.run_until(now + ENDED_HOLD_MAX * 2);
    assert_eq!(holds_expired(&net.logs[0], port), 1, "reported twice");
}

/// Released before its time, a kept flow is not reported, nor
/// counted; an open flow cannot be kept as ended.
#[test]
fn an_ended_flow_released_in_time_is_not_reported_and_an_open_one_is_not_kept() {
    let (mut net, port, theirs) = flow_across();
    let now = net.now;
    assert!(!net.sys[0].hold_ended(now, port), "an open flow was kept");
    assert_eq!(net.sys[0].write(now, port, b"still open"), Ok(()));
    net.sys[1].close(now, theirs);
    net.run_until(now + Duration::from_millis(200));
    let t = net.now;
    assert!(net.sys[0].hold_ended(t, port));
    assert_eq!(
        net.sys[0].write(t, port, b"late"),
        Err(FlowError::UnknownFlow(port.into())),
        "a kept flow carries nothing"
    );
    net.run_until(t + Duration::from_secs(1));
    net.sys[0].release_ended(port);
    net.run_until(t + ENDED_HOLD_MAX * 2);
    assert_eq!(holds_expired(&net.logs[0], port), 0);
    assert_eq!(net.sys[0].counters().ended_hold_expired, 0);
}
