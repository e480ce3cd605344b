//! The short ways of a connection without DTCP policies
//! ([`Connection::send_direct`], [`Connection::take_in_order`]) against the
//! queues they skip: two connections fed the same writes, arrivals and
//! time, one taking the short ways whenever they offer, must send the same
//! PDUs, deliver the same fragments in the same order, count the same and
//! want the same timers.

use super::*;
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Step {
    /// The local side writes a fragment.
    Write,
    /// A data PDU arrives, `ahead` of the peer's next in-order one
    /// (negative: an old one again), with or without DRF and ECN.
    Arrive { ahead: i64, drf: bool, ecn: bool },
    /// Time passes.
    Wait(u64),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => Just(Step::Write),
        8 => Just(Step::Arrive { ahead: 0, drf: false, ecn: false }),
        3 => (-3i64..6, prop::bool::weighted(0.1), prop::bool::weighted(0.2))
            .prop_map(|(ahead, drf, ecn)| Step::Arrive { ahead, drf, ecn }),
        2 => (0u64..3_000).prop_map(Step::Wait),
    ]
}

/// A connection and what came out of it.
struct Side {
    c: Connection,
    sent: Vec<(u64, bool, Vec<u8>)>,
    delivered: Vec<(u64, Vec<u8>)>,
}

impl Side {
    fn new(cfg: &EfcpConfig) -> Self {
        Side {
            c: Connection::new(cfg.clone(), Instant::ZERO).expect("valid config"),
            sent: Vec::new(),
            delivered: Vec::new(),
        }
    }

    fn drain(&mut self, now: Instant) {
        while let Some(d) = self.c.poll_deliver() {
            self.delivered.push((d.seq, d.payload.to_vec()));
        }
        while let Some(p) = self.c.poll_transmit(now) {
            if let Pdu::Data { seq, drf, payload } = p {
                self.sent.push((seq, drf, payload.to_vec()));
            }
        }
    }

    fn timers(&mut self, now: Instant) {
        if self.c.poll_timeout().is_some_and(|t| t <= now) {
            self.c.handle_timeout(now);
        }
        self.drain(now);
    }

    fn write(&mut self, now: Instant, payload: &[u8], direct: bool) {
        if direct {
            if let Some((seq, drf)) = self.c.send_direct(now) {
                self.sent.push((seq, drf, payload.to_vec()));
                return;
            }
        }
        self.c.write(now, payload).expect("room");
        self.drain(now);
    }

    fn arrive(&mut self, now: Instant, seq: u64, drf: bool, ecn: bool, direct: bool) {
        let payload = seq.to_be_bytes();
        if direct && self.c.take_in_order(now, seq, ecn) {
            self.delivered.push((seq, payload.to_vec()));
            return;
        }
        let meta = PduMeta { ecn, echo: None };
        let pdu = Pdu::Data {
            seq,
            drf,
            payload: PduBuf::from(&payload[..]),
        };
        self.c.on_pdu_meta(now, pdu, meta);
        self.drain(now);
    }
}

fn run(cfg: EfcpConfig, steps: &[Step]) -> Result<(), TestCaseError> {
    let (mut short, mut queued) = (Side::new(&cfg), Side::new(&cfg));
    let mut now = Instant::ZERO;
    let mut peer_next = 1u64;
    for (i, s) in steps.iter().enumerate() {
        short.timers(now);
        queued.timers(now);
        match *s {
            Step::Write => {
                let payload = (i as u64).to_be_bytes();
                short.write(now, &payload, true);
                queued.write(now, &payload, false);
            }
            Step::Arrive { ahead, drf, ecn } => {
                let seq = peer_next.saturating_add_signed(ahead).max(1);
                if seq >= peer_next {
                    peer_next = seq + 1;
                }
                short.arrive(now, seq, drf, ecn, true);
                queued.arrive(now, seq, drf, ecn, false);
            }
            Step::Wait(ms) => now = now + Duration::from_millis(ms),
        }
        prop_assert_eq!(
            &short.sent,
            &queued.sent,
            "sent, after step {} ({:?})",
            i,
            s
        );
        prop_assert_eq!(
            &short.delivered,
            &queued.delivered,
            "delivered, after step {}",
            i
        );
        prop_assert_eq!(
            short.c.stats(),
            queued.c.stats(),
            "counters, after step {}",
            i
        );
        prop_assert_eq!(
            short.c.poll_timeout(),
            queued.c.poll_timeout(),
            "timers, step {}",
            i
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn short_ways_match_the_queues_delivering_on_arrival(steps in prop::collection::vec(step(), 1..150)) {
        run(EfcpConfig::unreliable(), &steps)?;
    }

    #[test]
    fn short_ways_match_the_queues_in_order(steps in prop::collection::vec(step(), 1..150)) {
        let cfg = EfcpConfig { in_order: true, max_sdu_gap: Some(2), ..EfcpConfig::unreliable() };
        run(cfg, &steps)?;
    }
}

#[test]
fn the_short_ways_are_taken_by_a_flow_in_order_without_dtcp() {
    let mut c = Connection::new(EfcpConfig::unreliable(), Instant::ZERO).unwrap();
    assert_eq!(
        c.send_direct(Instant::ZERO),
        Some((1, true)),
        "the first PDU starts a run"
    );
    assert_eq!(c.send_direct(Instant::ZERO), Some((2, false)));
    assert_eq!(c.stats().pdus_sent, 2);
    // The first PDU in starts the run the ordinary way; the next is taken.
    let first = Pdu::Data {
        seq: 1,
        drf: true,
        payload: PduBuf::from(&b"a"[..]),
    };
    c.on_pdu(Instant::ZERO, first);
    assert!(c.poll_deliver().is_some());
    assert!(c.take_in_order(Instant::ZERO, 2, false));
    assert!(
        !c.take_in_order(Instant::ZERO, 4, false),
        "a gap goes the ordinary way"
    );
    assert_eq!(c.stats().delivered, 2);
}

#[test]
fn a_flow_with_dtcp_never_takes_the_short_ways() {
    for cfg in [EfcpConfig::reliable(), EfcpConfig::flow_controlled()] {
        let mut c = Connection::new(cfg, Instant::ZERO).unwrap();
        assert_eq!(c.send_direct(Instant::ZERO), None);
        let first = Pdu::Data {
            seq: 1,
            drf: true,
            payload: PduBuf::from(&b"a"[..]),
        };
        c.on_pdu(Instant::ZERO, first);
        assert!(!c.take_in_order(Instant::ZERO, 2, false));
        assert_eq!(c.stats().pdus_sent, 0);
    }
}
