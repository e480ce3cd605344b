//! Tests of the shim-hv machine: two machines joined by a VMPI link over
//! memory of this process, driven with explicit time.

use super::link::{region_size, Link, LinkConfig, LinkEvent};
use super::ring::{Geometry, HeapRegion};
use super::*;
use proptest::prelude::*;

const GEO: Geometry = Geometry {
    slot_size: 4096,
    slots: 64,
};

fn n(s: &str) -> AppName {
    s.parse().unwrap()
}

fn t(ms: u64) -> Instant {
    Instant::from_nanos(ms * 1_000_000)
}

/// Host and guest machines over one region, with their links.
struct Pair {
    _mem: HeapRegion,
    host: (ShimHv, Link),
    guest: (ShimHv, Link),
    delivered: Vec<(Side, PortId, Vec<u8>)>,
    events: Vec<(Side, Action)>,
}

impl Pair {
    fn new() -> Pair {
        let mem = HeapRegion::new(region_size(GEO));
        let r = mem.region();
        let hl = Link::create(r, GEO, 11, LinkConfig::default()).unwrap();
        let gl = Link::attach(r, 22, LinkConfig::default()).unwrap();
        let mut p = Pair {
            _mem: mem,
            host: (ShimHv::new(Config::new("hv", Side::Host)), hl),
            guest: (ShimHv::new(Config::new("hv", Side::Guest)), gl),
            delivered: Vec::new(),
            events: Vec::new(),
        };
        p.tick(t(0));
        p.tick(t(1));
        assert!(p.host.0.is_peer_up() && p.guest.0.is_peer_up());
        p
    }

    fn side(&mut self, s: Side) -> &mut (ShimHv, Link) {
        match s {
            Side::Host => &mut self.host,
            Side::Guest => &mut self.guest,
        }
    }

    /// Heartbeats of both ends at `now`.
    fn tick(&mut self, now: Instant) {
        for s in [Side::Host, Side::Guest] {
            let (m, l) = self.side(s);
            match l.tick(now) {
                Some(LinkEvent::Up) => m.peer_up(),
                Some(LinkEvent::Down) => m.peer_lost(),
                None => {}
            }
        }
    }

    /// Moves every queued buffer and action until nothing moves.
    fn run(&mut self, now: Instant) {
        let mut buf = vec![0u8; GEO.max_record()];
        loop {
            let mut moved = false;
            for s in [Side::Host, Side::Guest] {
                let (m, l) = self.side(s);
                let mut out = Vec::new();
                while let Some(a) = m.poll_action() {
                    match a {
                        Action::Transmit { buf } => l.send(&[&buf]).unwrap(),
                        other => out.push((s, other)),
                    }
                    moved = true;
                }
                let mut got = Vec::new();
                while let Ok(Some(k)) = l.recv(&mut buf) {
                    moved = true;
                    if let Received::Deliver { port, sdu } = m.on_buffer(now, &buf[..k]) {
                        got.push((s, port, sdu.to_vec()));
                    }
                }
                self.events.extend(out);
                self.delivered.extend(got);
            }
            if !moved {
                return;
            }
        }
    }

    fn send(&mut self, s: Side, port: PortId, sdu: &[u8]) {
        let (m, l) = self.side(s);
        let h = m.send_header(port, sdu.len()).unwrap();
        l.send(&[&h, sdu]).unwrap();
    }

    fn take_events(&mut self) -> Vec<(Side, Action)> {
        std::mem::take(&mut self.events)
    }

    /// Guest allocates `port` to `dst` at the host, host accepts as `hport`.
    fn open(&mut self, port: PortId, dst: &str, hport: PortId) {
        self.guest
            .0
            .allocate(t(2), port, n("vm-app"), n(dst), QosSpec::default())
            .unwrap();
        self.run(t(2));
        let ev = self.take_events();
        let Some((Side::Host, Action::FlowRequest { handle, .. })) = ev.first().cloned() else {
            panic!("expected a flow request, got {ev:?}");
        };
        self.host.0.accept(handle, hport).unwrap();
        self.run(t(3));
        let ev = self.take_events();
        assert!(
            ev.contains(&(
                Side::Guest,
                Action::Allocated {
                    port,
                    max_sdu: DEFAULT_MAX_SDU
                }
            )),
            "{ev:?}"
        );
    }
}

#[test]
fn allocate_data_both_ways_and_deallocate() {
    let mut p = Pair::new();
    p.host.0.register(n("echo")).unwrap();
    p.open(7, "echo", 70);
    let f = p.guest.0.flow(7).unwrap();
    assert_eq!(f.channel, 63, "the guest counts channels down from 63");
    p.send(Side::Guest, 7, b"ping");
    p.send(Side::Host, 70, &vec![5u8; 65_536]);
    p.run(t(4));
    assert_eq!(p.delivered[0], (Side::Host, 70, b"ping".to_vec()));
    assert_eq!(p.delivered[1], (Side::Guest, 7, vec![5u8; 65_536]));
    assert_eq!(p.guest.0.flow(7).unwrap().counters.bytes_in, 65_536);
    p.host.0.deallocate(70).unwrap();
    p.run(t(5));
    assert_eq!(
        p.take_events(),
        vec![(Side::Guest, Action::Deallocated { port: 7 })]
    );
    // Data for the closed channel is dropped and counted.
    let before = p.host.0.counters().rx_unknown_channel;
    p.guest.1.send(&[&vmpi::header(63), b"late"]).unwrap();
    p.run(t(6));
    assert_eq!(p.host.0.counters().rx_unknown_channel, before + 1);
}

#[test]
fn refusal_and_unregistered_name_carry_reasons() {
    let mut p = Pair::new();
    p.host.0.register(n("picky")).unwrap();
    p.guest
        .0
        .allocate(t(2), 1, n("a"), n("nobody"), QosSpec::default())
        .unwrap();
    p.run(t(2));
    let ev = p.take_events();
    assert!(
        matches!(&ev[..], [(Side::Guest, Action::AllocateFailed { port: 1, error: ShimHvError::Refused(r) })] if r.contains("not registered")),
        "{ev:?}"
    );
    p.guest
        .0
        .allocate(t(2), 2, n("a"), n("picky"), QosSpec::default())
        .unwrap();
    p.run(t(2));
    let Some((_, Action::FlowRequest { handle, .. })) = p.take_events().pop() else {
        panic!("no request");
    };
    p.host.0.refuse(handle, "not today").unwrap();
    p.run(t(3));
    let ev = p.take_events();
    assert!(
        matches!(&ev[..], [(Side::Guest, Action::AllocateFailed { port: 2, error: ShimHvError::Refused(r) })] if r == "not today"),
        "{ev:?}"
    );
    assert_eq!(p.guest.0.flows().count(), 0);
    assert_eq!(p.host.0.counters().alloc_refused, 2);
}

#[test]
fn channels_are_reused_round_robin_and_run_out_at_63() {
    let mut p = Pair::new();
    p.guest.0.register(n("vm")).unwrap();
    let mut seen = Vec::new();
    for k in 0..100u32 {
        p.host
            .0
            .allocate(t(2), k, n("h"), n("vm"), QosSpec::default())
            .unwrap();
        seen.push(p.host.0.flow(k).unwrap().channel);
        p.run(t(2));
        let Some((_, Action::FlowRequest { handle, .. })) = p.take_events().pop() else {
            panic!("no request");
        };
        p.guest.0.accept(handle, 1000 + k).unwrap();
        p.run(t(2));
        p.take_events();
        p.host.0.deallocate(k).unwrap();
        p.run(t(2));
        p.take_events();
    }
    assert_eq!(&seen[..3], &[1, 2, 3]);
    assert_eq!(seen[63], 1, "wraps after 63");
    for k in 0..63u32 {
        p.host
            .0
            .allocate(t(3), 500 + k, n("h"), n("vm"), QosSpec::default())
            .unwrap();
    }
    assert_eq!(
        p.host
            .0
            .allocate(t(3), 999, n("h"), n("vm"), QosSpec::default()),
        Err(ShimHvError::NoChannel)
    );
}

#[test]
fn colliding_channel_choice_is_won_by_the_host() {
    let mut p = Pair::new();
    p.host.0.register(n("h")).unwrap();
    p.guest.0.register(n("g")).unwrap();
    // Force both onto channel 5.
    p.host.0.last_channel = 4;
    p.guest.0.last_channel = 6;
    p.host
        .0
        .allocate(t(2), 1, n("h"), n("g"), QosSpec::default())
        .unwrap();
    p.guest
        .0
        .allocate(t(2), 2, n("g"), n("h"), QosSpec::default())
        .unwrap();
    assert_eq!(p.host.0.flow(1).unwrap().channel, 5);
    assert_eq!(p.guest.0.flow(2).unwrap().channel, 5);
    p.run(t(2));
    let ev = p.take_events();
    assert!(
        ev.iter()
            .any(|e| matches!(e, (Side::Guest, Action::AllocateFailed { port: 2, .. }))),
        "{ev:?}"
    );
    let Some((_, Action::FlowRequest { handle, .. })) = ev
        .iter()
        .find(|e| matches!(e, (Side::Guest, Action::FlowRequest { .. })))
        .cloned()
    else {
        panic!("the guest did not get the host's request: {ev:?}");
    };
    p.guest.0.accept(handle, 20).unwrap();
    p.run(t(3));
    assert!(p.take_events().contains(&(
        Side::Host,
        Action::Allocated {
            port: 1,
            max_sdu: DEFAULT_MAX_SDU
        }
    )));
    assert_eq!(p.host.0.counters().channel_collisions, 1);
    assert_eq!(p.guest.0.counters().channel_collisions, 1);
}

#[test]
fn a_silent_peer_ends_every_flow_and_a_new_one_can_attach() {
    let mut p = Pair::new();
    p.host.0.register(n("echo")).unwrap();
    p.open(7, "echo", 70);
    // Only the host beats from now on: the guest "died".
    for ms in 2..1500 {
        let (m, l) = &mut p.host;
        match l.tick(t(ms)) {
            Some(LinkEvent::Down) => m.peer_lost(),
            Some(LinkEvent::Up) => m.peer_up(),
            None => {}
        }
    }
    p.run(t(1500));
    assert_eq!(
        p.take_events(),
        vec![(Side::Host, Action::Deallocated { port: 70 })]
    );
    assert!(!p.host.0.is_peer_up());
    assert_eq!(
        p.host
            .0
            .allocate(t(1500), 1, n("h"), n("x"), QosSpec::default()),
        Err(ShimHvError::PeerDown)
    );
    // A new guest attaches to the same region.
    let r = p._mem.region();
    p.guest = (
        ShimHv::new(Config::new("hv", Side::Guest)),
        Link::attach(r, 33, LinkConfig::default()).unwrap(),
    );
    p.tick(t(1501));
    p.tick(t(1502));
    assert!(p.host.0.is_peer_up() && p.guest.0.is_peer_up());
    p.open(8, "echo", 80);
    p.send(Side::Guest, 8, b"again");
    p.run(t(1503));
    assert_eq!(
        p.delivered.last().unwrap(),
        &(Side::Host, 80, b"again".to_vec())
    );
}

#[test]
fn timeouts_fail_allocations_and_withdraw_requests() {
    let mut p = Pair::new();
    p.guest.0.register(n("g")).unwrap();
    p.guest
        .0
        .allocate(t(2), 1, n("g"), n("h"), QosSpec::default())
        .unwrap();
    // Nobody runs the host: the request is never answered.
    assert_eq!(
        p.guest.0.poll_timeout(),
        Some(t(2) + Duration::from_secs(2))
    );
    p.guest.0.handle_timeout(t(2) + Duration::from_secs(2));
    let mut ev = Vec::new();
    while let Some(a) = p.guest.0.poll_action() {
        ev.push(a);
    }
    assert!(
        ev.iter().any(|a| matches!(
            a,
            Action::AllocateFailed {
                port: 1,
                error: ShimHvError::Timeout(_)
            }
        )),
        "{ev:?}"
    );
    let q = QosSpec {
        reliable: true,
        ..QosSpec::default()
    };
    assert!(matches!(
        p.guest.0.allocate(t(3), 2, n("g"), n("h"), q),
        Err(ShimHvError::QosNotSatisfiable(_))
    ));
}

#[test]
fn garbage_buffers_are_counted_not_fatal() {
    let mut p = Pair::new();
    let m = &mut p.host.0;
    let now = t(2);
    assert!(matches!(m.on_buffer(now, &[1, 2]), Received::Dropped(_)));
    assert!(matches!(
        m.on_buffer(now, &[0, 0, 0, 0, 9]),
        Received::Dropped(_)
    ));
    assert!(matches!(
        m.on_buffer(now, &[0, 0, 0, 0, 1, 3, 0, 0, 0, 0]),
        Received::Dropped(DropReason::Unexpected(3))
    ));
    assert!(matches!(
        m.on_buffer(now, &[9, 0, 0, 0, 1]),
        Received::Dropped(DropReason::UnknownChannel(9))
    ));
    assert_eq!(m.counters().rx_malformed, 2);
    assert_eq!(m.counters().rx_unknown_channel, 1);
}

proptest! {
    /// Any buffer, control or data, leaves the machine working.
    #[test]
    fn any_buffer_is_handled(bufs in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 0..20)) {
        let mut p = Pair::new();
        p.host.0.register(n("echo")).unwrap();
        for b in &bufs {
            let _ = p.host.0.on_buffer(t(2), b);
        }
        while p.host.0.poll_action().is_some() {}
        p.host.0.handle_timeout(t(100_000));
        while p.host.0.poll_action().is_some() {}
        p.open(7, "echo", 70);
    }
}

#[test]
fn a_full_ring_delays_buffers_in_the_backlog_in_order_and_counts_only_overflow() {
    use super::link::{Backlog, BacklogOutcome};
    let mem = HeapRegion::new(region_size(GEO));
    let r = mem.region();
    let mut host = Link::create(r, GEO, 11, LinkConfig::default()).unwrap();
    let mut guest = Link::attach(r, 22, LinkConfig::default()).unwrap();
    // 64 slots of 4 KiB: 10 frames of 20 000 bytes (5 slots each) fill 50.
    let frame = |k: u32| {
        let mut f = vec![(k % 251) as u8; 20_000];
        f[..4].copy_from_slice(&k.to_le_bytes());
        f
    };
    let mut bl = Backlog::new(100, 1 << 20);
    let mut outcomes = Vec::new();
    for k in 0..40 {
        outcomes.push(bl.send(&mut host, &[&frame(k)]));
    }
    let sent = outcomes
        .iter()
        .filter(|o| **o == BacklogOutcome::Sent)
        .count();
    assert_eq!(sent, 12, "the ring takes what fits");
    assert!(outcomes[sent..]
        .iter()
        .all(|o| *o == BacklogOutcome::Queued));
    assert_eq!(bl.len(), 28);
    assert!(
        host.arm_tx(bl.front_len().unwrap()),
        "full: the sender sleeps"
    );
    // The receiver drains; the sleeping sender is to be rung, flushes, and
    // every frame arrives once, in order.
    let mut buf = vec![0u8; 70_000];
    let mut got = Vec::new();
    let mut rings = 0;
    loop {
        while let Some(n) = guest.recv(&mut buf).unwrap() {
            got.push(u32::from_le_bytes(buf[..4].try_into().unwrap()));
            assert_eq!(buf[..n], frame(*got.last().unwrap())[..]);
        }
        if guest.peer_wants_room() {
            rings += 1;
            if bl.flush(&mut host).unwrap() {
                continue;
            }
            assert!(host.arm_tx(bl.front_len().unwrap()));
        } else if bl.is_empty() {
            break;
        } else {
            panic!("the sender waits and nobody rings it");
        }
    }
    assert_eq!(got, (0..40).collect::<Vec<_>>());
    assert!(rings >= 2, "{rings} doorbells");
    assert_eq!(bl.overflow(), 0);
    // A backlog that is full itself loses the buffer and counts it.
    let mut small = Backlog::new(2, 1 << 20);
    let mut lost = 0;
    for k in 0..20 {
        if small.send(&mut host, &[&frame(k)]) == BacklogOutcome::Overflow {
            lost += 1;
        }
    }
    assert_eq!((lost, small.overflow(), small.len()), (6, 6, 2));
}

#[test]
fn data_headers_are_checked_and_counted_like_whole_buffers() {
    let mut p = Pair::new();
    p.host.0.register(n("echo")).unwrap();
    p.open(1, "echo", 7);
    let ch = p.host.0.flow(7).unwrap().channel;
    let host = &mut p.host.0;
    let rx0 = host.counters().rx_buffers;
    assert_eq!(host.on_data_header(ch, 1000), Ok(7));
    assert_eq!(host.on_data_header(ch, 0), Err(DropReason::EmptySdu(ch)));
    assert_eq!(
        host.on_data_header(ch, DEFAULT_MAX_SDU as usize + 1),
        Err(DropReason::TooLarge {
            channel: ch,
            len: DEFAULT_MAX_SDU as usize + 1
        })
    );
    assert_eq!(
        host.on_data_header(ch + 1, 10),
        Err(DropReason::UnknownChannel(ch + 1))
    );
    // The control channel is parsed from a copy, never handed over raw.
    assert_eq!(
        host.on_data_header(CONTROL_CHANNEL, 10),
        Err(DropReason::Unexpected(CONTROL_CHANNEL))
    );
    let c = host.flow(7).unwrap().counters;
    assert_eq!((c.sdus_in, c.bytes_in, c.drops_in), (1, 1000, 2));
    assert_eq!(host.counters().rx_buffers, rx0 + 5);
    // A buffer left in the ring (its application had no room) and taken
    // again later is counted once.
    assert_eq!(host.on_data_header(ch, 500), Ok(7));
    host.unreceive(7, 500);
    assert_eq!(host.on_data_header(ch, 500), Ok(7));
    let c = host.flow(7).unwrap().counters;
    assert_eq!((c.sdus_in, c.bytes_in), (2, 1500));
    assert_eq!(host.counters().rx_buffers, rx0 + 6);
}
