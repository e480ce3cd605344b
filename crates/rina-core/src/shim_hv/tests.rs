//! Tests of the shim-hv machine: two machines joined by a VMPI link over
//! memory of this process, driven with explicit time.

use super::link::{region_size, Link, LinkConfig, LinkEvent};
use super::ring::{Geometry, HeapRegion};
use super::*;
use credit::Window;
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

// ---- credit-based flow control --------------------------------------------

impl Pair {
    /// A pair whose guest has credit off (`guest_credit` None) or a window.
    fn with_credit(host: Option<Window>, guest: Option<Window>) -> Pair {
        let mut p = Pair::new();
        p.host.0.cfg.credit = host;
        p.guest.0.cfg.credit = guest;
        p
    }

    /// Sends SDUs of `len` bytes on `port` from `s` while it has credit,
    /// at most `max`, moving them across as the ring fills; how many went.
    fn send_while_credit(
        &mut self,
        s: Side,
        port: PortId,
        len: usize,
        max: usize,
        now: Instant,
    ) -> usize {
        let sdu = vec![0xA5u8; len];
        let mut sent = 0;
        while sent < max && self.side(s).0.may_send(port) {
            self.send(s, port, &sdu);
            sent += 1;
            if sent % 16 == 0 || len > 4096 {
                self.run(now);
            }
        }
        self.run(now);
        sent
    }

    /// Delivered SDUs of `port` at `s`, taken from the list.
    fn take_delivered(&mut self, s: Side, port: PortId) -> Vec<Vec<u8>> {
        let (mine, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut self.delivered)
            .into_iter()
            .partition(|(side, p, _)| *side == s && *p == port);
        self.delivered = rest;
        mine.into_iter().map(|(_, _, d)| d).collect()
    }
}

const SMALL: Window = Window {
    sdus: 32,
    bytes: 1 << 20,
};

#[test]
fn a_flow_without_credit_waits_while_another_channel_flows() {
    let mut p = Pair::with_credit(Some(SMALL), Some(SMALL));
    p.host.0.register(n("stalled")).unwrap();
    p.host.0.register(n("busy")).unwrap();
    p.open(1, "stalled", 10);
    p.open(2, "busy", 20);
    assert!(p.host.0.rx_flow_controlled(10) && p.guest.0.rx_flow_controlled(1));
    assert_eq!(p.guest.0.flow(1).unwrap().credit_left(), Some(32));

    // The application of flow 10 takes nothing: 32 SDUs, then no credit.
    let sent = p.send_while_credit(Side::Guest, 1, 100, 1000, t(10));
    assert_eq!(sent, 32);
    assert!(!p.guest.0.may_send(1));
    assert_eq!(p.take_delivered(Side::Host, 10).len(), 32);
    assert_eq!(p.host.0.flow(10).unwrap().held(), Some(32));
    assert!(matches!(
        p.guest.0.send_header(1, 100),
        Err(ShimHvError::NoCredit(1))
    ));

    // Flow 20 goes on, its credit replenished as its application reads.
    let mut total = 0;
    for round in 0..20 {
        total += p.send_while_credit(Side::Guest, 2, 1000, 1000, t(11 + round));
        let got = p.take_delivered(Side::Host, 20);
        let bytes = got.iter().map(|d| d.len() as u64).sum();
        p.host
            .0
            .delivered(t(11 + round), 20, got.len() as u64, bytes);
        p.run(t(11 + round));
    }
    assert!(total >= 20 * 24, "flow 20 kept flowing: {total} SDUs");
    assert_eq!(p.host.0.flow(20).unwrap().held(), Some(0));
    assert!(!p.guest.0.may_send(1), "flow 1 still waits");

    // The stalled application reads: a quarter of the window brings credit.
    p.host.0.delivered(t(40), 10, 7, 700);
    p.run(t(40));
    assert!(!p.guest.0.may_send(1), "less than a quarter taken");
    p.host.0.delivered(t(41), 10, 1, 100);
    p.run(t(41));
    assert_eq!(p.guest.0.flow(1).unwrap().credit_left(), Some(8));
    assert_eq!(p.send_while_credit(Side::Guest, 1, 100, 1000, t(42)), 8);
    assert_eq!(p.host.0.counters().rx_over_credit, 0);
    assert_eq!(p.guest.0.counters().rx_bad_credit, 0);
    assert!(p.host.0.counters().credits_sent > 20);
}

#[test]
fn a_lost_grant_is_sent_again_so_the_flow_does_not_stop_for_good() {
    let mut p = Pair::with_credit(Some(SMALL), Some(SMALL));
    p.host.0.register(n("x")).unwrap();
    p.open(1, "x", 10);
    assert_eq!(p.send_while_credit(Side::Guest, 1, 100, 1000, t(10)), 32);
    assert_eq!(p.take_delivered(Side::Host, 10).len(), 32);
    // The application takes a quarter: the grant is lost on the way.
    p.host.0.delivered(t(20), 10, 8, 800);
    let lost: Vec<_> = std::iter::from_fn(|| p.host.0.poll_action()).collect();
    assert!(
        matches!(lost.as_slice(), [Action::Transmit { .. }]),
        "{lost:?}"
    );
    p.run(t(20));
    assert!(!p.guest.0.may_send(1), "the guest never heard of the grant");
    // Nothing comes though the guest may send more: the grant goes again.
    let again = t(20) + REGRANT_FIRST;
    assert_eq!(p.host.0.poll_timeout(), Some(again));
    p.host.0.handle_timeout(again);
    p.run(again);
    assert_eq!(p.guest.0.flow(1).unwrap().credit_left(), Some(8));
    assert_eq!(p.host.0.counters().credits_resent, 1);
    // Data flows again: no more repeats while it does; once the sender
    // has used what it was granted, none is due.
    assert_eq!(p.send_while_credit(Side::Guest, 1, 100, 1000, again), 8);
    let later = p.host.0.poll_timeout().expect("a check is due");
    p.host.0.handle_timeout(later);
    p.run(later);
    assert_eq!(p.host.0.counters().credits_resent, 1);
    assert_eq!(p.host.0.poll_timeout(), None);
    assert_eq!(p.guest.0.counters().rx_bad_credit, 0);
}

#[test]
fn the_byte_window_limits_large_sdus() {
    let w = Window {
        sdus: 1000,
        bytes: 200_000,
    };
    let mut p = Pair::with_credit(Some(w), Some(w));
    p.host.0.register(n("x")).unwrap();
    p.open(1, "x", 10);
    // 65 536-byte SDUs: three fit below 200 000 bytes, the fourth goes
    // past it (one SDU of overshoot), then no more.
    let sent = p.send_while_credit(Side::Guest, 1, 65_536, 100, t(10));
    assert_eq!(sent, 4);
    p.host.0.delivered(t(11), 10, 4, 4 * 65_536);
    p.run(t(11));
    assert_eq!(p.send_while_credit(Side::Guest, 1, 65_536, 100, t(12)), 4);
}

#[test]
fn a_peer_without_credit_support_still_works_unlimited() {
    for (host, guest) in [(Some(SMALL), None), (None, Some(SMALL))] {
        let mut p = Pair::with_credit(host, guest);
        p.host.0.register(n("x")).unwrap();
        p.guest.0.register(n("y")).unwrap();
        p.open(1, "x", 10);
        assert!(!p.host.0.rx_flow_controlled(10));
        assert!(!p.guest.0.rx_flow_controlled(1));
        // Far more than a window both ways, nobody telling deliveries.
        assert_eq!(p.send_while_credit(Side::Guest, 1, 10, 500, t(10)), 500);
        assert_eq!(p.send_while_credit(Side::Host, 10, 10, 500, t(11)), 500);
        assert_eq!(p.take_delivered(Side::Host, 10).len(), 500);
        assert_eq!(p.take_delivered(Side::Guest, 1).len(), 500);
        p.host.0.delivered(t(12), 10, 500, 5000);
        p.run(t(12));
        for m in [&p.host.0, &p.guest.0] {
            let c = m.counters();
            assert_eq!(
                (
                    c.credits_sent,
                    c.rx_malformed,
                    c.rx_unexpected,
                    c.rx_bad_credit
                ),
                (0, 0, 0, 0),
                "no credit message went to an end that never heard of it"
            );
        }
    }
}

#[test]
fn flows_of_normal_ipcps_are_never_limited() {
    let mut p = Pair::with_credit(Some(SMALL), Some(SMALL));
    p.host.0.register(n("ipcp")).unwrap();
    p.guest
        .0
        .allocate_with(t(2), 1, (n("g"), n("ipcp")), QosSpec::default(), false)
        .unwrap();
    p.run(t(2));
    let Some((_, Action::FlowRequest { handle, .. })) = p.take_events().pop() else {
        panic!("no request");
    };
    p.host.0.accept_with(handle, 10, false).unwrap();
    p.run(t(3));
    assert!(!p.host.0.rx_flow_controlled(10) && !p.guest.0.rx_flow_controlled(1));
    assert_eq!(p.guest.0.flow(1).unwrap().credit_left(), None);
    assert_eq!(p.send_while_credit(Side::Guest, 1, 10, 300, t(4)), 300);
    assert_eq!(p.send_while_credit(Side::Host, 10, 10, 300, t(5)), 300);
    assert_eq!(p.host.0.counters().rx_over_credit, 0);
}

#[test]
fn hostile_credit_messages_are_counted_and_dropped() {
    let mut p = Pair::with_credit(Some(SMALL), Some(SMALL));
    p.host.0.register(n("x")).unwrap();
    p.open(1, "x", 10);
    let ch = p.guest.0.flow(1).unwrap().channel;
    let credit = |channel, sdus, bytes| {
        Control::Credit {
            channel,
            sdus,
            bytes,
        }
        .to_buffer()
    };
    let before = *p.host.0.counters();
    let bad = [
        credit(ch, u64::MAX, u64::MAX), // a huge window
        credit(ch, 33, 1 << 20),        // a window and one SDU ahead
        credit(ch, 31, 1 << 20),        // credit taken back
        credit(5, 40, 40),              // a channel with no flow
        credit(ch, 0, 0),               // taken back to nothing
    ];
    for b in &bad {
        p.guest.1.send(&[b]).unwrap();
    }
    let good = credit(ch, 32, 1 << 20);
    // Truncated: every length short of the whole message.
    for k in 5..good.len() {
        p.guest.1.send(&[&good[..k]]).unwrap();
    }
    p.run(t(5));
    let c = p.host.0.counters();
    assert_eq!(c.rx_bad_credit - before.rx_bad_credit, bad.len() as u64);
    assert_eq!(
        c.rx_malformed - before.rx_malformed,
        (good.len() - 5) as u64
    );
    assert_eq!(p.host.0.flow(10).unwrap().credit_left(), Some(32));
    // The flow is unharmed, and the same limits again are fine.
    p.guest.1.send(&[&good]).unwrap();
    p.run(t(6));
    assert_eq!(p.host.0.counters().credits_received, 1);
    assert_eq!(p.send_while_credit(Side::Host, 10, 10, 100, t(7)), 32);
}

#[test]
fn data_beyond_the_window_is_dropped_and_counted() {
    let mut p = Pair::with_credit(Some(SMALL), Some(SMALL));
    p.host.0.register(n("x")).unwrap();
    p.open(1, "x", 10);
    let ch = p.guest.0.flow(1).unwrap().channel;
    // A guest ignoring its credit: 40 SDUs straight into the ring.
    for k in 0..40u8 {
        p.guest.1.send(&[&vmpi::header(ch), &[k]]).unwrap();
        if k % 16 == 15 {
            p.run(t(5));
        }
    }
    p.run(t(5));
    assert_eq!(p.take_delivered(Side::Host, 10).len(), 32);
    assert_eq!(p.host.0.counters().rx_over_credit, 8);
    assert_eq!(p.host.0.flow(10).unwrap().counters.drops_in, 8);
    assert_eq!(p.host.0.flow(10).unwrap().held(), Some(32), "bounded");
}

proptest! {
    /// Whatever credit messages come, for whatever channel: no panic, and
    /// the credit of the open flow never exceeds a window.
    #[test]
    fn any_credit_message_is_handled(msgs in proptest::collection::vec((0u32..70, any::<u64>(), any::<u64>(), 0usize..26), 0..30)) {
        let mut p = Pair::with_credit(Some(SMALL), Some(SMALL));
        p.host.0.register(n("x")).unwrap();
        p.open(1, "x", 10);
        for (ch, sdus, bytes, cut) in msgs {
            let mut b = Control::Credit { channel: ch, sdus: sdus % 100, bytes }.to_buffer();
            b.truncate(cut.max(4));
            let _ = p.host.0.on_buffer(t(5), &b);
            prop_assert!(p.host.0.flow(10).unwrap().credit_left().unwrap() <= 32);
        }
    }
}
