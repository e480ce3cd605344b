//! Systems over shim-eth and shim-hv media, joined back to back by an
//! in-test wire with explicit time; credit on read; neighbours changed at
//! run time.

use super::*;
use crate::efcp::EfcpConfig;
use crate::normal::cubes::QosCube;
use crate::normal::MembershipConfig;
use crate::rmt::FifoConfig;
use crate::shim_hv::Side;
use rina_wire::shim_eth::MacAddr;
use std::time::Duration;

fn ms(v: u64) -> Instant {
    Instant::from_nanos(v * 1_000_000)
}

fn name(s: &str) -> AppName {
    s.parse().unwrap()
}

/// The kind of medium 0 of both systems.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Eth,
    Hv,
}

/// Two systems whose medium 0 is joined back to back with a 1 ms wire.
struct Pair {
    sys: [System; 2],
    kind: Kind,
    wire: Vec<(Instant, usize, Vec<u8>)>,
    events: [Vec<AppEvent>; 2],
    sdus: [Vec<(PortId, Vec<u8>)>; 2],
    membership: [usize; 2],
    /// Frames each side put on the wire.
    sent: [u64; 2],
    now: Instant,
}

impl Pair {
    fn new(kind: Kind, build: impl Fn(usize, &mut System)) -> Pair {
        let sys = [0, 1].map(|i| {
            let mut s = System::new(format!("s{i}"));
            match kind {
                Kind::Eth => {
                    let mac = MacAddr([2, 0, 0, 0, 0, i as u8 + 1]);
                    let cfg = shim_eth::Config::new("eth", None, mac, 1500);
                    s.add_shim_eth("eth", cfg, None).unwrap();
                }
                Kind::Hv => {
                    let side = if i == 0 { Side::Host } else { Side::Guest };
                    s.add_shim_hv("hv", shim_hv::Config::new("hv", side), None)
                        .unwrap();
                }
            }
            build(i, &mut s);
            s
        });
        let mut p = Pair {
            sys,
            kind,
            wire: Vec::new(),
            events: [Vec::new(), Vec::new()],
            sdus: [Vec::new(), Vec::new()],
            membership: [0, 0],
            sent: [0, 0],
            now: Instant::ZERO,
        };
        if kind == Kind::Hv {
            for i in 0..2 {
                p.sys[i].hv_peer(Instant::ZERO, 0, true);
            }
        }
        p
    }

    fn collect(&mut self) {
        for i in 0..2 {
            while let Some(o) = self.sys[i].poll_output() {
                match o {
                    Output::ToMedium {
                        medium,
                        peer,
                        frame,
                    } => {
                        assert_eq!((medium, peer), (0, None), "one medium, no UDP peer");
                        self.sent[i] += 1;
                        let at = self.now + Duration::from_millis(1);
                        self.wire.push((at, 1 - i, frame.into_vec()));
                    }
                    Output::ToApp { port, sdu } => self.sdus[i].push((port, sdu.into_vec())),
                    Output::App(ev) => self.events[i].push(ev),
                    Output::Membership { .. } => self.membership[i] += 1,
                    Output::Alarm { .. } | Output::RibRead { .. } => {}
                }
            }
        }
    }

    fn deliver(&mut self, dst: usize, frame: &[u8]) {
        let rx = match self.kind {
            Kind::Eth => Rx::Eth {
                frame,
                aux_vlan: None,
            },
            Kind::Hv => Rx::Hv { buf: frame },
        };
        if let Some((port, sdu)) = self.sys[dst].receive(self.now, 0, rx) {
            self.sdus[dst].push((port, sdu.to_vec()));
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
            let (due, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut self.wire)
                .into_iter()
                .partition(|w| w.0 <= self.now);
            self.wire = rest;
            for (_, dst, frame) in due {
                self.deliver(dst, &frame);
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

    fn request(&self, i: usize) -> Option<u64> {
        self.events[i].iter().rev().find_map(|e| match e {
            AppEvent::FlowRequest { handle, .. } => Some(*handle),
            _ => None,
        })
    }

    /// Whether system `i` reported flow `port` allocated.
    fn allocated(&self, i: usize, port: PortId) -> bool {
        self.events[i]
            .iter()
            .any(|e| matches!(e, AppEvent::Allocated { port: p, .. } if *p == port))
    }

    /// Allocates a flow from `app0` at s0 to `app1` at s1 in `dif`.
    fn flow(&mut self, dif: &str, qos: QosSpec) -> (PortId, PortId) {
        let port = self.sys[0]
            .allocate(self.now, Some(dif), name("app0"), name("app1"), qos)
            .unwrap();
        self.run_until(self.now + Duration::from_millis(200));
        let handle = self.request(1).expect("the request reached app1");
        let (theirs, _) = self.sys[1].accept(self.now, handle).unwrap();
        self.run_until(self.now + Duration::from_millis(200));
        assert!(self.allocated(0, port), "flow {port} not allocated");
        (port, theirs)
    }

    fn got(&self, i: usize, port: PortId) -> Vec<u8> {
        self.sdus[i]
            .iter()
            .filter(|(p, _)| *p == port)
            .map(|(_, s)| s[0])
            .collect()
    }
}

fn cubes() -> Vec<QosCube> {
    vec![
        QosCube::new(1, "unreliable", EfcpConfig::unreliable()),
        QosCube::new(2, "reliable", EfcpConfig::reliable()),
    ]
}

/// A normal IPCP `s<i>.net` (address i+1) over medium 0, with the other
/// system's as neighbour when `neighbour` is set.
fn normal_over(i: usize, s: &mut System, neighbour: bool) {
    let over = s.member(0).unwrap().dif.clone();
    let mut nc = NormalConfig::new("net", i as u64 + 1);
    nc.membership = Some(MembershipConfig::new(name(&format!("s{i}.net"))));
    nc.routing = Some(crate::routing::Config::default());
    nc.cubes = cubes();
    for p in 0..2u64 {
        nc.directory.insert(name(&format!("app{p}")), p + 1);
    }
    let nbs = if neighbour {
        vec![NeighborSpec {
            name: name(&format!("s{}.net", 1 - i)),
            over,
            address: None,
        }]
    } else {
        Vec::new()
    };
    let sched = SchedulerConfig::Fifo(FifoConfig { queue_len: 100 });
    s.add_normal(name(&format!("s{i}.net")), nc, &sched, nbs, BTreeMap::new())
        .unwrap();
}

#[test]
fn an_application_flow_straight_on_shim_eth_crosses_by_arp() {
    let mut p = Pair::new(Kind::Eth, |_, _| {});
    p.sys[1].register("eth", name("app1")).unwrap();
    let (mine, theirs) = p.flow("eth", QosSpec::default());
    for k in 0..5u8 {
        p.sys[0].write(p.now, mine, &[k; 300]).unwrap();
    }
    p.run_until(p.now + Duration::from_millis(10));
    // The first SDU of the peer's flow came with its request (held, then
    // delivered at acceptance); the rest straight from the frames.
    assert_eq!(p.got(1, theirs), vec![0, 1, 2, 3, 4]);
    // And the driver's zero-copy path: a header to put before the SDU.
    let (medium, send) = p.sys[1].shim_send(p.now, theirs, &[7u8; 100]).unwrap();
    assert_eq!((medium, send.peer, send.header().len()), (0, None, 14));
}

#[test]
fn a_tapped_medium_keeps_copies_of_what_it_sends_and_receives_bounded() {
    for kind in [Kind::Eth, Kind::Hv] {
        let mut p = Pair::new(kind, |_, _| {});
        p.sys[0].set_medium_tap(0, Some(10_000));
        p.sys[1].register(kind_dif(kind), name("app1")).unwrap();
        let (mine, theirs) = p.flow(kind_dif(kind), QosSpec::default());
        p.sys[0].write(p.now, mine, &[9; 300]).unwrap();
        p.run_until(p.now + Duration::from_millis(10));
        let (_, send) = p.sys[0].shim_send(p.now, mine, &[8; 50]).unwrap();
        let hdr = send.header().to_vec();
        let mut copies = Vec::new();
        while let Some(t) = p.sys[0].poll_medium_tapped(0) {
            copies.push(t);
        }
        // Sent and received copies, as many as went on the wire.
        let sent = copies.iter().filter(|t| t.outbound).count() as u64;
        assert_eq!(sent, p.sent[0] + 1, "{kind:?}");
        assert!(copies.iter().any(|t| !t.outbound), "{kind:?}: the answer");
        // The SDU written through the system, and the one sent by the
        // driver with the header it was given.
        assert!(copies
            .iter()
            .any(|t| t.outbound && t.frame.ends_with(&[9; 300])));
        let last = copies.last().unwrap();
        assert_eq!(last.frame, [hdr, vec![8; 50]].concat(), "{kind:?}");
        let _ = theirs;
        // Bounded: a tap of one copy loses the rest, counted.
        p.sys[0].set_medium_tap(0, Some(1));
        for _ in 0..3 {
            p.sys[0].shim_send(p.now, mine, &[1; 10]).unwrap();
        }
        assert_eq!(p.sys[0].medium_tap_dropped(0), 2, "{kind:?}");
        assert!(p.sys[0].poll_medium_tapped(0).is_some());
        assert!(p.sys[0].poll_medium_tapped(0).is_none());
        // Untapped: nothing kept.
        p.sys[0].set_medium_tap(0, None);
        p.sys[0].shim_send(p.now, mine, &[1; 10]).unwrap();
        assert!(p.sys[0].poll_medium_tapped(0).is_none());
    }
}

fn kind_dif(kind: Kind) -> &'static str {
    match kind {
        Kind::Eth => "eth",
        Kind::Hv => "hv",
    }
}

#[test]
fn a_normal_dif_over_shim_eth_and_over_shim_hv_carries_a_reliable_flow() {
    for kind in [Kind::Eth, Kind::Hv] {
        let mut p = Pair::new(kind, |i, s| normal_over(i, s, true));
        p.sys[1].register("net", name("app1")).unwrap();
        p.run_until(ms(1000));
        assert_eq!(p.sys[0].n1_flows().count(), 1, "{kind:?}: the N-1 flow");
        assert!(p.membership[0] > 0, "{kind:?}: enrollment news for the log");
        let qos = QosSpec {
            cube: Some(2),
            ..Default::default()
        };
        let (mine, theirs) = p.flow("net", qos);
        for k in 0..50u8 {
            p.sys[0].write(p.now, mine, &[k; 1000]).unwrap();
            p.run_until(p.now + Duration::from_millis(1));
        }
        p.run_until(p.now + Duration::from_millis(500));
        assert_eq!(p.got(1, theirs), (0..50).collect::<Vec<u8>>(), "{kind:?}");
    }
}

#[test]
fn with_credit_on_read_a_reader_that_does_not_read_stops_its_writer() {
    let mut p = Pair::new(Kind::Hv, |i, s| {
        s.set_credit_on_read(true);
        normal_over(i, s, true);
    });
    p.sys[1].register("net", name("app1")).unwrap();
    p.run_until(ms(1000));
    let qos = QosSpec {
        cube: Some(2),
        ..Default::default()
    };
    let (mine, theirs) = p.flow("net", qos);
    let mut written = 0usize;
    let blocked = loop {
        match p.sys[0].write(p.now, mine, &[7; 500]) {
            Ok(()) => written += 1,
            Err(FlowError::WouldBlock) => break true,
            Err(e) => panic!("{e}"),
        }
        p.run_until(p.now + Duration::from_millis(2));
        if written > 10_000 {
            break false;
        }
    };
    assert!(blocked, "the writer was never stopped");
    p.run_until(p.now + Duration::from_millis(200));
    let held = p.got(1, theirs).len();
    assert!(
        held < written,
        "the receiver holds {held} of {written}: the rest wait at the sender"
    );
    // The application takes what it has: credit flows back, the rest
    // comes, and the writer may go on. Nothing was lost meanwhile.
    let mut taken = 0;
    for _ in 0..20 {
        let now_have = p.got(1, theirs).len();
        p.sys[1].consumed(p.now, theirs, now_have - taken);
        taken = now_have;
        p.run_until(p.now + Duration::from_millis(100));
    }
    assert_eq!(
        p.got(1, theirs).len(),
        written,
        "nothing lost while stopped"
    );
    assert!(
        p.events[0].contains(&AppEvent::Writable { port: mine }),
        "{:?}",
        p.events[0]
    );
    p.sys[0].write(p.now, mine, &[8; 500]).unwrap();
}

/// A driver may hold every SDU of a reliable flow whose credit goes back on
/// read (its window bounds them), and at most [`MAX_HELD_SDUS`] SDUs and
/// [`MAX_HELD_BYTES`] bytes of an unreliable one, or of any flow when
/// credit goes back on delivery.
#[test]
fn a_driver_may_hold_all_of_a_flow_its_window_bounds_and_a_bounded_share_of_others() {
    for credit_on_read in [true, false] {
        let mut p = Pair::new(Kind::Hv, |i, s| {
            s.set_credit_on_read(credit_on_read);
            normal_over(i, s, true);
        });
        p.sys[1].register("net", name("app1")).unwrap();
        p.run_until(ms(1000));
        let cube = |c| QosSpec {
            cube: Some(c),
            ..Default::default()
        };
        let (unreliable, _) = p.flow("net", cube(1));
        let (reliable, _) = p.flow("net", cube(2));
        let s = &p.sys[0];
        for port in [unreliable, reliable] {
            assert!(s.may_hold(port, MAX_HELD_SDUS - 1, MAX_HELD_BYTES - 1));
        }
        let beyond = [(MAX_HELD_SDUS, 0), (0, MAX_HELD_BYTES), (1 << 20, 1 << 30)];
        for (sdus, bytes) in beyond {
            assert!(
                !s.may_hold(unreliable, sdus, bytes),
                "{sdus} SDUs, {bytes} B"
            );
            assert_eq!(
                s.may_hold(reliable, sdus, bytes),
                credit_on_read,
                "reliable, credit on read {credit_on_read}: {sdus} SDUs, {bytes} B"
            );
        }
    }
}

#[test]
fn a_neighbour_added_at_run_time_gets_its_n1_flow_and_loses_it_when_removed() {
    let mut p = Pair::new(Kind::Eth, |i, s| normal_over(i, s, false));
    p.run_until(ms(1000));
    assert_eq!(p.sys[0].n1_flows().count(), 0);
    for i in 0..2 {
        let spec = NeighborSpec {
            name: name(&format!("s{}.net", 1 - i)),
            over: "eth".into(),
            address: None,
        };
        p.sys[i].add_neighbor(p.now, 1, spec.clone()).unwrap();
        assert!(
            p.sys[i].add_neighbor(p.now, 1, spec).is_err(),
            "twice is refused"
        );
    }
    p.run_until(ms(2000));
    assert_eq!(p.sys[0].n1_flows().count(), 1);
    assert_eq!(p.sys[1].n1_flows().count(), 1);
    assert!(p.sys[0].remove_neighbor(p.now, 1, &name("s1.net")));
    assert!(!p.sys[0].remove_neighbor(p.now, 1, &name("s1.net")));
    assert_eq!(p.sys[0].n1_flows().count(), 0);
    p.run_until(ms(5000));
    assert_eq!(p.sys[0].n1_flows().count(), 0, "not set up again");
    // A shim has no neighbours; a DIF that is not below is refused.
    assert!(p.sys[0].lower_for(0, "net").is_err());
    assert!(p.sys[0].lower_for(1, "nowhere").is_err());
}
