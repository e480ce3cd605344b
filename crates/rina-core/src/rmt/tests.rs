//! Unit tests of the RMT: forwarding, relaying, FIFO bounds and counters.

use super::*;

fn pdu(qos_id: u64, tag: u8) -> QueuedPdu {
    QueuedPdu {
        qos_id,
        mgmt: false,
        bytes: vec![tag].into(),
    }
}

fn rmt(cap: usize) -> Rmt {
    let mut r = Rmt::new(Box::new(Fifo::new(cap)));
    r.add_port(1);
    r.add_port(2);
    r
}

const T0: Instant = Instant::ZERO;

#[test]
fn routes_by_destination_and_qos() {
    let mut r = rmt(10);
    r.table_mut().set(7, None, vec![1]);
    r.table_mut().set(7, Some(3), vec![2]);
    assert_eq!(r.send(T0, 7, 0, pdu(1, 0xa)), Ok(1), "any-QoS entry");
    assert_eq!(
        r.send(T0, 7, 0, pdu(3, 0xb)),
        Ok(2),
        "the QoS-specific entry wins"
    );
    assert_eq!(
        r.send(T0, 9, 0, pdu(1, 0xc)),
        Err(RmtError::NoRoute { dst: 9, qos_id: 1 })
    );
    assert_eq!(r.poll_output(T0, 1).map(|b| b.into_vec()), Some(vec![0xa]));
    assert_eq!(r.poll_output(T0, 2).map(|b| b.into_vec()), Some(vec![0xb]));
    assert_eq!(r.poll_output(T0, 1), None);
    assert_eq!(r.counters().no_route, 1);
}

#[test]
fn equal_cost_ports_keep_a_flow_on_one_path() {
    let mut r = rmt(100);
    r.table_mut().set(5, None, vec![1, 2]);
    let a: Vec<_> = (0..10)
        .map(|_| r.send(T0, 5, 41, pdu(0, 0)).unwrap())
        .collect();
    assert!(a.windows(2).all(|w| w[0] == w[1]), "one flow, one port");
    let b = r.send(T0, 5, 42, pdu(0, 0)).unwrap();
    assert_ne!(a[0], b, "another flow may take the other port");
}

#[test]
fn fifo_is_bounded_and_counts() {
    let mut r = rmt(3);
    r.table_mut().set(7, None, vec![1]);
    for i in 0..5 {
        let res = r.send(T0, 7, 0, pdu(0, i));
        assert_eq!(res.is_ok(), i < 3, "PDU {i}");
    }
    let mut mgmt = pdu(0, 0xee);
    mgmt.mgmt = true;
    assert_eq!(r.send_on(T0, 1, mgmt), Err(RmtError::QueueFull(1)));
    assert_eq!(r.counters().queue_drops, 3);
    let s = &r.queue_stats(1)[0];
    assert_eq!((s.queued, s.dropped, s.max_occupancy), (3, 3, 3));
    assert_eq!(r.queued(), 3, "the FIFO's own count agrees with its stats");
    let out: Vec<_> = std::iter::from_fn(|| r.poll_output(T0, 1)).collect();
    assert_eq!(out, vec![vec![0], vec![1], vec![2]], "first in, first out");
    assert_eq!(r.queue_stats(1)[0].sent, 3);
    assert_eq!(r.queued(), 0);
}

#[test]
fn management_goes_first() {
    let mut r = rmt(10);
    r.table_mut().set(7, None, vec![1]);
    r.send(T0, 7, 0, pdu(0, 1)).unwrap();
    let mut m = pdu(0, 2);
    m.mgmt = true;
    r.send_on(T0, 1, m).unwrap();
    assert_eq!(r.poll_output(T0, 1).map(|b| b.into_vec()), Some(vec![2]));
    assert_eq!(r.poll_output(T0, 1).map(|b| b.into_vec()), Some(vec![1]));
}

#[test]
fn removing_a_port_drops_its_queue_and_routes() {
    let mut r = rmt(10);
    r.table_mut().set(7, None, vec![1, 2]);
    r.table_mut().set(8, None, vec![1]);
    r.send_on(T0, 1, pdu(0, 1)).unwrap();
    r.remove_port(1);
    assert_eq!(r.counters().queue_drops, 1);
    assert_eq!(r.table().len(), 1, "the entry only through port 1 is gone");
    assert_eq!(r.send(T0, 7, 0, pdu(0, 0)), Ok(2));
    assert_eq!(r.send_on(T0, 1, pdu(0, 0)), Err(RmtError::UnknownPort(1)));
}

#[test]
fn relaying_is_counted() {
    let mut r = rmt(10);
    r.table_mut().set(3, None, vec![2]);
    assert_eq!(r.relay(T0, 3, 0, pdu(0, 9)), Ok(2));
    assert_eq!(r.counters().relayed, 1);
    assert_eq!(r.counters().queued, 1);
}

/// A data PDU frame (PCI type DT at offset 0, flags after it, no CRC).
fn dt_frame(tag: u8) -> Vec<u8> {
    vec![rina_wire::pci::PduType::Dt.code(), 0, tag]
}

/// An RMT of FIFOs of `cap` PDUs routing address 7 to port 1, marking
/// data PDUs that leave `threshold` or more behind (the PDU type in the
/// frame's first byte).
fn ecn_rmt(cap: usize, threshold: usize) -> Rmt {
    let mut r = rmt(cap);
    r.table_mut().set(7, None, vec![1]);
    let layout = FrameLayout {
        type_at: 0,
        crc: false,
    };
    let marking = EcnMarking::fixed(threshold);
    r.set_ecn(Some((marking, layout)));
    r
}

#[test]
fn ecn_marks_data_pdus_that_leave_a_queue_past_the_threshold() {
    use rina_wire::pci::flags;
    let mut r = ecn_rmt(100, 4);
    for i in 0..7 {
        let p = QueuedPdu {
            qos_id: 0,
            mgmt: false,
            bytes: dt_frame(i).into(),
        };
        r.send(T0, 7, 0, p).unwrap();
    }
    // Nothing is marked while it waits: the flag is set as a PDU leaves.
    let mut m = QueuedPdu {
        qos_id: 0,
        mgmt: true,
        bytes: dt_frame(0xee).into(),
    };
    m.bytes[0] = rina_wire::pci::PduType::Mgmt.code();
    r.send_on(T0, 1, m).unwrap();
    assert_eq!(r.counters().ecn_marked, 0);
    let out: Vec<_> = std::iter::from_fn(|| r.poll_output(T0, 1)).collect();
    let marked: Vec<bool> = out.iter().map(|f| f[1] & flags::ECN != 0).collect();
    // Management first, never marked; then PDUs leaving 6, 5, 4 behind
    // are marked, those leaving 3, 2, 1, 0 are not.
    assert_eq!(
        marked,
        vec![false, true, true, true, false, false, false, false]
    );
    assert_eq!(r.counters().ecn_marked, 3);
}

#[test]
fn the_default_ecn_threshold_grows_with_the_ports_rate() {
    let m = EcnMarking::default();
    let at = |bps: u64| m.threshold_at(0, Some(PortRate::new(bps)));
    // DCTCP's figures: 20 up to about 1.5 Gb/s, 65 at 10 Gb/s.
    assert_eq!(at(10_000_000), 20);
    assert_eq!(at(1_000_000_000), 20);
    assert_eq!(at(10_000_000_000), 65);
    assert_eq!(at(40_000_000_000), 260);
    assert_eq!(m.threshold_at(0, None), FAST_PORT_ECN_THRESHOLD);
    // A configured threshold, or one of a QoS-id, holds on every port.
    let fixed = EcnMarking::fixed(20);
    assert_eq!(fixed.threshold_at(0, None), 20);
    assert_eq!(
        fixed.threshold_at(0, Some(PortRate::new(40_000_000_000))),
        20
    );
    let mut per = EcnMarking::default();
    per.per_qos.insert(3, 5);
    assert_eq!(per.threshold_at(3, None), 5);
    assert_eq!(per.threshold_at(0, None), 65);
    assert_eq!(EcnMarking::fixed(0).threshold_at(0, None), 0);
}

#[test]
fn an_unpaced_port_marks_from_the_fast_threshold_a_paced_one_from_its_rate() {
    let layout = FrameLayout {
        type_at: 0,
        crc: false,
    };
    // 40 data PDUs queued on each port, drained: how many leave marked.
    let marked = |rate: Option<PortRate>| {
        let mut r = rmt(100);
        r.table_mut().set(7, None, vec![1]);
        r.set_port_rate(1, rate);
        r.set_ecn(Some((EcnMarking::default(), layout)));
        for i in 0..40 {
            let p = QueuedPdu {
                qos_id: 0,
                mgmt: false,
                bytes: dt_frame(i).into(),
            };
            r.send_on(T0, 1, p).unwrap();
        }
        let mut n = 0;
        let mut t = T0;
        while n < 40 {
            t = t + Duration::from_millis(10);
            while r.poll_output(t, 1).is_some() {
                n += 1;
            }
        }
        r.counters().ecn_marked
    };
    // Paced at 10 Mb/s: PDUs leaving 20..39 behind are marked (20).
    assert_eq!(marked(Some(PortRate::new(10_000_000))), 20);
    // Not paced: the threshold is 65, more than the queue ever held.
    assert_eq!(marked(None), 0);
}

/// What `send_through` returns, as (port, passed at once).
fn through(r: &mut Rmt, tag: u8, admit: bool) -> (PortId, bool) {
    let burst = if admit { usize::MAX } else { 0 };
    match r.send_through(T0, 7, 0, pdu(0, tag), burst).unwrap() {
        Through::Queued(p) => (p, false),
        Through::Now(p, b) => {
            assert_eq!(&b[..], &[tag], "the PDU itself comes back");
            (p, true)
        }
    }
}

#[test]
fn fifo_passes_a_pdu_through_only_where_a_poll_would_take_it_at_once() {
    let mut r = rmt(10);
    r.table_mut().set(7, None, vec![1]);
    assert_eq!(
        through(&mut r, 1, true),
        (1, true),
        "empty queue, open gate"
    );
    assert_eq!(r.port_sent(1), 1, "counted as sent");
    assert_eq!(r.counters().queued, 1);
    assert_eq!(
        through(&mut r, 2, false),
        (1, false),
        "the caller's burst is spent"
    );
    assert_eq!(
        through(&mut r, 3, true),
        (1, false),
        "behind a queued PDU, never ahead of it"
    );
    r.set_port_blocked(1, true);
    let out: Vec<_> = std::iter::from_fn(|| r.poll_output(T0, 1)).collect();
    assert!(out.is_empty(), "a blocked gate holds the queue");
    r.set_port_blocked(1, false);
    let out: Vec<_> = std::iter::from_fn(|| r.poll_output(T0, 1))
        .map(|b| b.into_vec())
        .collect();
    assert_eq!(out, vec![vec![2], vec![3]], "in order");
    r.set_port_blocked(1, true);
    assert_eq!(through(&mut r, 4, true), (1, false), "closed gate: queued");
    assert_eq!(r.port_sent(1), 3);
    assert_eq!(r.counters().queued, 4);
}

#[test]
fn nothing_passes_where_a_mark_or_another_policy_could_apply() {
    // ECN at threshold 0 marks a PDU leaving an empty queue: it is queued
    // so that poll_output marks it.
    let mut r = ecn_rmt(10, 0);
    assert_eq!(through(&mut r, 1, true), (1, false));
    // A policy that orders what arrives together sees every PDU queued.
    let bucket = SchedulerConfig::TokenBucket(TokenBucketConfig {
        rate_bps: 8_000_000,
        burst_bytes: 100_000,
        excess: Excess::Delay,
        queue_len: 10,
    });
    let mut r = Rmt::new(bucket.build(&CuMap::new()).unwrap());
    r.add_port(1);
    r.table_mut().set(7, None, vec![1]);
    assert_eq!(through(&mut r, 1, true), (1, false));
    assert_eq!(r.poll_output(T0, 1).map(|b| b.into_vec()), Some(vec![1]));
}

#[test]
fn qos_specific_routes_come_and_go_over_the_any_qos_route() {
    let mut t = ForwardingTable::default();
    t.set(7, None, vec![1]);
    t.set(7, Some(3), vec![2]);
    t.set(7, Some(3), vec![2, 4]);
    assert_eq!(t.lookup(7, 3, 1), Some(4), "replaced, not added");
    assert_eq!(t.lookup(7, 5, 1), Some(1));
    t.set(7, Some(3), vec![]);
    assert_eq!(t.lookup(7, 3, 1), Some(1), "back to the any-QoS route");
    t.set(8, Some(3), vec![2]);
    t.remove_port(2);
    assert_eq!(t.lookup(8, 3, 0), None);
    t.set(8, Some(3), vec![5]);
    assert_eq!(
        t.lookup(8, 3, 0),
        Some(5),
        "a new QoS-specific route is seen"
    );
    let listed: Vec<_> = t.entries().map(|(a, q, p)| (a, q, p.to_vec())).collect();
    assert_eq!(
        listed,
        vec![(7, None, vec![1]), (8, Some(3), vec![5])],
        "listed in order"
    );
}
