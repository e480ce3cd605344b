//! Tests with explicit time: two endpoints joined by a seeded lossy channel.

use super::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::BTreeMap;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn t(ms_: u64) -> Instant {
    Instant::ZERO + ms(ms_)
}

fn sdu(i: u64) -> Vec<u8> {
    i.to_be_bytes().to_vec()
}

fn sdu_index(p: &[u8]) -> u64 {
    u64::from_be_bytes(p.try_into().expect("8-byte test SDU"))
}

/// Scripted loss: drop every PDU this says yes to.
type Filter = Box<dyn FnMut(&Pdu) -> bool>;

/// One direction of a link: serialization time per PDU, fixed delay plus
/// uniform jitter (which reorders), seeded loss and duplication.
struct Channel {
    /// Time to put one PDU on the link (back-to-back PDUs are spaced).
    spacing: Duration,
    last_departure: Instant,
    delay: Duration,
    jitter: Duration,
    loss: f64,
    dup: f64,
    rng: ChaCha8Rng,
    queue: BTreeMap<(Instant, u64), Pdu>,
    next_id: u64,
    sent: u64,
    lost: u64,
    /// Drop every PDU this says yes to (scripted loss).
    filter: Option<Filter>,
}

impl Channel {
    fn new(seed: u64, delay: Duration) -> Self {
        Channel {
            spacing: Duration::from_micros(50),
            last_departure: Instant::ZERO,
            delay,
            jitter: Duration::ZERO,
            loss: 0.0,
            dup: 0.0,
            rng: ChaCha8Rng::seed_from_u64(seed),
            queue: BTreeMap::new(),
            next_id: 0,
            sent: 0,
            lost: 0,
            filter: None,
        }
    }

    fn lossy(mut self, loss: f64) -> Self {
        self.loss = loss;
        self
    }

    fn send(&mut self, now: Instant, pdu: Pdu) {
        self.sent += 1;
        if let Some(f) = self.filter.as_mut() {
            if f(&pdu) {
                self.lost += 1;
                return;
            }
        }
        if self.rng.gen_bool(self.loss) {
            self.lost += 1;
            return;
        }
        let departure = now.max(self.last_departure + self.spacing);
        self.last_departure = departure;
        let copies = if self.rng.gen_bool(self.dup) { 2 } else { 1 };
        for _ in 0..copies {
            let jitter = if self.jitter.is_zero() {
                Duration::ZERO
            } else {
                Duration::from_nanos(self.rng.gen_range(0..self.jitter.as_nanos() as u64))
            };
            self.queue
                .insert((departure + self.delay + jitter, self.next_id), pdu.clone());
            self.next_id += 1;
        }
    }

    fn next(&self) -> Option<Instant> {
        self.queue.keys().next().map(|k| k.0)
    }

    fn pop_due(&mut self, now: Instant) -> Option<Pdu> {
        let (&(at, _), _) = self.queue.iter().next()?;
        if at <= now {
            self.queue.pop_first().map(|(_, p)| p)
        } else {
            None
        }
    }
}

/// Endpoint `a` sends to `b`; both directions carry control PDUs.
struct Sim {
    now: Instant,
    a: Connection,
    b: Connection,
    ab: Channel,
    ba: Channel,
    /// Times and PDUs `a` transmitted.
    a_log: Vec<(Instant, Pdu)>,
    log_a: bool,
    /// Times and PDUs `b` transmitted.
    b_log: Vec<(Instant, Pdu)>,
    log_b: bool,
}

impl Sim {
    fn new(cfg: EfcpConfig, ab: Channel, ba: Channel) -> Self {
        Sim {
            now: Instant::ZERO,
            a: Connection::new(cfg.clone(), Instant::ZERO).unwrap(),
            b: Connection::new(cfg, Instant::ZERO).unwrap(),
            ab,
            ba,
            a_log: Vec::new(),
            log_a: false,
            b_log: Vec::new(),
            log_b: false,
        }
    }

    fn pump(&mut self) {
        while let Some(p) = self.a.poll_transmit(self.now) {
            if self.log_a {
                self.a_log.push((self.now, p.clone()));
            }
            self.ab.send(self.now, p);
        }
        while let Some(p) = self.b.poll_transmit(self.now) {
            if self.log_b {
                self.b_log.push((self.now, p.clone()));
            }
            self.ba.send(self.now, p);
        }
    }

    /// Runs until `app` says done (true) or `until`; `app` is called at
    /// every event and returns (done, its next wake-up).
    fn run(
        &mut self,
        until: Instant,
        mut app: impl FnMut(&mut Sim) -> (bool, Option<Instant>),
    ) -> bool {
        for _ in 0..50_000_000u64 {
            let (done, wake) = app(self);
            if done {
                return true;
            }
            self.pump();
            let next = [
                self.a.poll_timeout(),
                self.b.poll_timeout(),
                self.ab.next(),
                self.ba.next(),
                wake,
            ]
            .into_iter()
            .flatten()
            .min();
            let Some(next) = next else {
                return false;
            };
            if next > until {
                return false;
            }
            self.now = self.now.max(next);
            while let Some(p) = self.ab.pop_due(self.now) {
                self.b.on_pdu(self.now, p);
            }
            while let Some(p) = self.ba.pop_due(self.now) {
                self.a.on_pdu(self.now, p);
            }
            if self.a.poll_timeout().is_some_and(|d| d <= self.now) {
                self.a.handle_timeout(self.now);
            }
            if self.b.poll_timeout().is_some_and(|d| d <= self.now) {
                self.b.handle_timeout(self.now);
            }
        }
        panic!("simulation did not settle");
    }
}

fn reliable_cfg() -> EfcpConfig {
    EfcpConfig {
        in_order: true,
        max_sdu_gap: Some(0),
        max_pdu_lifetime: ms(1000),
        max_reorder: 64,
        a_timer: ms(5),
        max_send_queue: 64,
        dtcp: Some(DtcpConfig {
            cc: None,
            window: Some(WindowFc {
                initial_credit: 32,
                max_closed_queue: 16,
                receiver_buffer: 64,
            }),
            rate: None,
            rtx: Some(RtxConfig {
                initial_rto: ms(200),
                min_rto: ms(20),
                max_rto: ms(2000),
                max_retries: 30,
                ack_every: 4,
            }),
        }),
    }
}

/// Writes `n` SDUs from `a` as fast as allowed; `b` delivers and consumes
/// at once. Returns the indices `b` delivered.
fn transfer(sim: &mut Sim, n: u64, until: Instant) -> Vec<u64> {
    let mut written = 0u64;
    let mut got = Vec::with_capacity(n as usize);
    let ok = sim.run(until, |s| {
        while written < n && s.a.can_write() {
            s.a.write(s.now, sdu(written)).unwrap();
            written += 1;
        }
        let mut k = 0;
        while let Some(d) = s.b.poll_deliver() {
            got.push(sdu_index(&d.payload));
            k += 1;
        }
        s.b.consumed(s.now, k);
        (got.len() as u64 == n && s.a.in_flight() == 0, None)
    });
    assert!(
        ok,
        "transfer stalled at {} of {n} ({:?})",
        got.len(),
        sim.a.stats()
    );
    got
}

// 1. Reliable + window over loss: exactly once, in order.
fn reliable_over_loss(loss: f64, seed: u64) -> (Stats, Stats, u64, Instant) {
    let ab = Channel::new(seed, ms(10)).lossy(loss);
    let ba = Channel::new(seed + 1, ms(10)).lossy(loss);
    let mut sim = Sim::new(reliable_cfg(), ab, ba);
    let n = 10_000;
    let got = transfer(&mut sim, n, t(3_600_000));
    assert_eq!(got, (0..n).collect::<Vec<_>>());
    assert!(!sim.a.is_failed());
    (
        *sim.a.stats(),
        *sim.b.stats(),
        sim.ab.lost + sim.ba.lost,
        sim.now,
    )
}

#[test]
fn reliable_window_over_5_percent_loss() {
    let (a, b, lost, end) = reliable_over_loss(0.05, 1);
    eprintln!(
        "5% loss: 10000 SDUs in {:?} virtual; sent {} new + {} rtx ({:.1}%), rto expirations {}, \
         fast rtx {}, PDUs lost {lost}, dups at receiver {}, acks sent {}, srtt {:?}, rto {:?}",
        end - Instant::ZERO,
        a.pdus_sent,
        a.pdus_retransmitted,
        100.0 * a.pdus_retransmitted as f64 / a.pdus_sent as f64,
        a.rto_expirations,
        a.fast_retransmits,
        b.duplicates,
        b.acks_sent,
        a.srtt,
        a.rto
    );
    assert_eq!(a.pdus_sent, 10_000);
    assert_eq!(b.delivered, 10_000);
    assert!(a.pdus_retransmitted >= 400 && a.pdus_retransmitted < 2_000);
}

#[test]
fn reliable_window_over_20_percent_loss() {
    let (a, b, lost, end) = reliable_over_loss(0.20, 7);
    eprintln!(
        "20% loss: 10000 SDUs in {:?} virtual; sent {} new + {} rtx ({:.1}%), rto expirations {}, \
         fast rtx {}, PDUs lost {lost}, dups at receiver {}, acks sent {}",
        end - Instant::ZERO,
        a.pdus_sent,
        a.pdus_retransmitted,
        100.0 * a.pdus_retransmitted as f64 / a.pdus_sent as f64,
        a.rto_expirations,
        a.fast_retransmits,
        b.duplicates,
        b.acks_sent
    );
    assert_eq!(b.delivered, 10_000);
    assert!(a.pdus_retransmitted >= 2_000);
}

#[test]
fn reliable_with_reordering_and_duplication() {
    let mut ab = Channel::new(11, ms(5)).lossy(0.05);
    ab.jitter = ms(8);
    ab.dup = 0.05;
    let mut ba = Channel::new(12, ms(5)).lossy(0.05);
    ba.jitter = ms(8);
    let mut sim = Sim::new(reliable_cfg(), ab, ba);
    let got = transfer(&mut sim, 3000, t(3_600_000));
    assert_eq!(got, (0..3000).collect::<Vec<_>>());
    assert!(sim.b.stats().duplicates > 0);
}

// 2. Flow control without retransmission, slow receiver.
#[test]
fn window_without_rtx_never_overruns_a_slow_receiver() {
    let buffer = 16;
    let cfg = EfcpConfig {
        in_order: true,
        max_sdu_gap: None,
        max_pdu_lifetime: ms(1000),
        max_reorder: 16,
        a_timer: ms(2),
        max_send_queue: 1,
        dtcp: Some(DtcpConfig {
            cc: None,
            window: Some(WindowFc {
                initial_credit: 16,
                max_closed_queue: 4,
                receiver_buffer: buffer,
            }),
            rate: None,
            rtx: None,
        }),
    };
    let mut sim = Sim::new(cfg, Channel::new(3, ms(1)), Channel::new(4, ms(1)));
    let n = 2000u64;
    let (mut written, mut would_block, mut max_buffered) = (0u64, 0u64, 0usize);
    let mut got = Vec::new();
    let mut next_read = t(1);
    let ok = sim.run(t(60_000), |s| {
        while written < n {
            match s.a.write(s.now, sdu(written)) {
                Ok(()) => written += 1,
                Err(EfcpError::WouldBlock) => {
                    would_block += 1;
                    break;
                }
                Err(e) => panic!("{e}"),
            }
        }
        max_buffered = max_buffered.max(s.b.receiver_buffered());
        assert!(s.b.receiver_buffered() <= buffer, "overrun");
        if s.now >= next_read {
            if let Some(d) = s.b.poll_deliver() {
                got.push(sdu_index(&d.payload));
                s.b.consumed(s.now, 1);
            }
            next_read = s.now + ms(1);
        }
        (got.len() as u64 == n, Some(next_read))
    });
    assert!(ok);
    let (a, b) = (sim.a.stats(), sim.b.stats());
    eprintln!(
        "slow receiver: {n} SDUs in {:?}; max buffered {max_buffered}/{buffer}; WouldBlock {would_block}; \
         FC PDUs {}; rendezvous {}",
        sim.now - Instant::ZERO,
        b.fc_sent,
        a.rendezvous_sent
    );
    assert_eq!(got, (0..n).collect::<Vec<_>>());
    assert!(would_block > 0);
    assert_eq!(max_buffered, buffer, "the window is used fully");
    assert_eq!(b.skipped + b.dropped_queue + b.duplicates, 0);
    // The reader sets the pace: about one SDU per millisecond.
    assert!(sim.now >= t(2000) && sim.now < t(2100), "{:?}", sim.now);
}

#[test]
fn lost_window_updates_are_recovered_by_rendezvous() {
    let cfg = EfcpConfig {
        in_order: true,
        max_sdu_gap: None,
        max_pdu_lifetime: ms(100),
        max_reorder: 8,
        a_timer: ms(1),
        max_send_queue: 1,
        dtcp: Some(DtcpConfig {
            cc: None,
            window: Some(WindowFc {
                initial_credit: 4,
                max_closed_queue: 2,
                receiver_buffer: 4,
            }),
            rate: None,
            rtx: None,
        }),
    };
    let mut ba = Channel::new(1, ms(1));
    // Lose the first five window updates.
    let mut dropped = 0;
    ba.filter = Some(Box::new(move |p| {
        if matches!(p, Pdu::Fc { .. }) && dropped < 5 {
            dropped += 1;
            true
        } else {
            false
        }
    }));
    let mut sim = Sim::new(cfg, Channel::new(2, ms(1)), ba);
    let got = transfer(&mut sim, 100, t(10_000));
    assert_eq!(got, (0..100).collect::<Vec<_>>());
    assert!(sim.a.stats().rendezvous_sent > 0);
    assert!(sim.b.stats().rendezvous_received > 0);
}

#[test]
fn window_without_rtx_over_loss_never_blocks() {
    // Lost data and lost window updates: holes are given up, rendezvous
    // tells the receiver about the tail, and the transfer completes.
    let mut cfg = reliable_cfg();
    cfg.max_sdu_gap = None;
    cfg.dtcp.as_mut().unwrap().rtx = None;
    let mut sim = Sim::new(
        cfg,
        Channel::new(5, ms(3)).lossy(0.1),
        Channel::new(6, ms(3)).lossy(0.1),
    );
    let n = 3000u64;
    let mut written = 0;
    let mut got = Vec::new();
    let ok = sim.run(t(600_000), |s| {
        while written < n && s.a.can_write() {
            s.a.write(s.now, sdu(written)).unwrap();
            written += 1;
        }
        let mut k = 0;
        while let Some(d) = s.b.poll_deliver() {
            got.push(sdu_index(&d.payload));
            k += 1;
        }
        s.b.consumed(s.now, k);
        let b = s.b.stats();
        (
            written == n && s.a.send_queue_len() == 0 && b.delivered + b.skipped >= n,
            None,
        )
    });
    assert!(ok, "blocked: {:?} {:?}", sim.a.stats(), sim.b.stats());
    assert!(got.windows(2).all(|w| w[0] < w[1]));
    let b = sim.b.stats();
    eprintln!(
        "window, no rtx, 10% loss: delivered {} skipped {} rendezvous {} (channel lost {} of {})",
        b.delivered,
        b.skipped,
        sim.a.stats().rendezvous_sent,
        sim.ab.lost,
        sim.ab.sent
    );
    assert!(b.delivered > 2500);
}

// 3. Unreliable with max_sdu_gap over loss.
fn gap_flow(in_order: bool, gap: Option<u64>, rtx: bool, seed: u64) -> (Vec<u64>, Stats, u64) {
    let cfg = EfcpConfig {
        in_order,
        max_sdu_gap: gap,
        max_pdu_lifetime: ms(200),
        max_reorder: 32,
        a_timer: ms(4),
        max_send_queue: 64,
        dtcp: rtx.then(|| DtcpConfig {
            cc: None,
            window: None,
            rate: None,
            rtx: Some(RtxConfig {
                initial_rto: ms(50),
                min_rto: ms(10),
                max_rto: ms(500),
                max_retries: 40,
                ack_every: 2,
            }),
        }),
    };
    let mut ab = Channel::new(seed, ms(5)).lossy(0.1);
    ab.jitter = ms(3);
    ab.dup = 0.05;
    let mut sim = Sim::new(cfg, ab, Channel::new(seed + 1, ms(5)).lossy(0.1));
    let n = 5000u64;
    let mut written = 0;
    let mut got = Vec::new();
    let mut next_write = Instant::ZERO;
    let ok = sim.run(t(600_000), |s| {
        // One SDU every 200 µs.
        if written < n && s.now >= next_write && s.a.can_write() {
            s.a.write(s.now, sdu(written)).unwrap();
            written += 1;
            next_write = s.now + Duration::from_micros(200);
        }
        while let Some(d) = s.b.poll_deliver() {
            assert_eq!(sdu_index(&d.payload) + 1, d.seq);
            got.push(d.seq);
        }
        let idle = written == n && s.a.send_queue_len() == 0 && s.a.in_flight() == 0;
        let settle = next_write + ms(100);
        let wake = if written == n {
            settle
        } else if s.now >= next_write {
            s.now + Duration::from_micros(200) // blocked: try again later
        } else {
            next_write
        };
        (
            idle && s.ab.next().is_none() && s.b.deliverable() == 0 && s.now >= settle,
            Some(wake),
        )
    });
    assert!(ok);
    (got, *sim.b.stats(), sim.b.receive_lwe().unwrap_or(0))
}

fn gaps(seqs: &[u64]) -> Vec<u64> {
    let mut v: Vec<u64> = seqs
        .windows(2)
        .map(|w| w[1] - w[0] - 1)
        .filter(|g| *g > 0)
        .collect();
    if let Some(&first) = seqs.first() {
        if first > 1 {
            v.insert(0, first - 1);
        }
    }
    v
}

#[test]
fn unreliable_in_order_with_gap_skips_holes_and_reports_large_ones() {
    let n = 2;
    let (got, b, lwe) = gap_flow(true, Some(n), false, 21);
    // In order, no duplicates.
    assert!(got.windows(2).all(|w| w[0] < w[1]));
    let holes = gaps(&got);
    let too_big = holes.iter().filter(|g| **g > n).count() as u64;
    eprintln!(
        "unreliable in-order gap<={n}, 10% loss: delivered {} of 5000, holes {} (largest {}), \
         over the limit {too_big} = gap_exceeded {}, duplicates dropped {}",
        got.len(),
        holes.len(),
        holes.iter().max().unwrap_or(&0),
        b.gap_exceeded,
        b.duplicates
    );
    // Documented semantics: without rtx every hole is given up after A;
    // holes larger than the gap are counted, none goes unreported.
    assert_eq!(too_big, b.gap_exceeded);
    assert_eq!(holes.len() as u64, b.holes);
    // Nothing is stuck: everything up to the LWE was delivered or given up
    // (a lost tail has nothing behind it to reveal the hole).
    assert_eq!(got.len() as u64 + b.skipped, lwe);
    assert!(lwe > 4990);
    assert!(b.duplicates > 0, "the channel duplicated PDUs");
}

#[test]
fn unreliable_out_of_order_delivers_on_arrival_without_duplicates() {
    let (got, b, lwe) = gap_flow(false, None, false, 31);
    let mut sorted = got.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), got.len(), "no duplicates");
    assert!(
        got.windows(2).any(|w| w[0] > w[1]),
        "jitter reordered something"
    );
    // Up to the LWE everything was delivered or given up. This seed
    // reorders PDU 2 before the DRF PDU 1: the run starts where the peer's
    // numbers begin, so PDU 1 is taken when it comes (it used to be
    // dropped as stale).
    assert_eq!(got.len() as u64 + b.skipped, lwe);
    assert_eq!(got.iter().min(), Some(&1));
    assert!(lwe > 4990);
    assert_eq!(b.gap_exceeded, 0);
}

#[test]
fn partial_reliability_keeps_holes_within_the_gap() {
    let n = 2;
    let (got, b, _) = gap_flow(true, Some(n), true, 41);
    let holes = gaps(&got);
    eprintln!(
        "rtx + gap<={n}, 10% loss: delivered {} of 5000, holes {}, largest {}",
        got.len(),
        holes.len(),
        holes.iter().max().unwrap_or(&0)
    );
    assert!(got.windows(2).all(|w| w[0] < w[1]));
    assert!(holes.iter().all(|g| *g <= n), "{holes:?}");
    assert_eq!(b.gap_exceeded, 0);
    assert!(!holes.is_empty());
}

// 4. RTO per RFC 6298.
#[test]
fn rto_follows_rfc6298() {
    let mut e = RttEstimator::new(ms(1000), ms(10), ms(3000));
    assert_eq!(e.rto(), ms(1000));
    assert_eq!(e.srtt(), None);
    e.sample(ms(100));
    assert_eq!(e.srtt(), Some(ms(100)));
    assert_eq!(e.rttvar(), ms(50));
    assert_eq!(e.rto(), ms(300)); // 100 + 4·50
    e.sample(ms(200));
    // RTTVAR = 3/4·50 + 1/4·|100 − 200| = 62.5; SRTT = 7/8·100 + 1/8·200 = 112.5
    assert_eq!(e.rttvar(), Duration::from_micros(62_500));
    assert_eq!(e.srtt(), Some(Duration::from_micros(112_500)));
    assert_eq!(e.rto(), Duration::from_micros(362_500));
    e.backoff();
    assert_eq!(e.rto(), ms(725));
    e.backoff();
    assert_eq!(e.rto(), ms(1450));
    e.backoff();
    assert_eq!(e.rto(), ms(2900));
    e.backoff();
    assert_eq!(e.rto(), ms(3000), "capped at max_rto");
    e.backoff();
    assert_eq!(e.rto(), ms(3000));
    e.reset_backoff();
    assert_eq!(e.rto(), Duration::from_micros(362_500));
    // Steady samples shrink RTTVAR until G dominates; then min_rto clamps.
    for _ in 0..200 {
        e.sample(ms(4));
    }
    assert_eq!(e.srtt(), Some(ms(4)));
    assert_eq!(e.rto(), ms(10), "4 ms + G = 5 ms, clamped to min_rto");
    let mut g = RttEstimator::new(ms(1000), ms(1), ms(3000));
    for _ in 0..200 {
        g.sample(ms(40));
    }
    assert_eq!(g.rto(), ms(41), "SRTT + G when RTTVAR is ~0");
}

fn rtx_only(max_retries: u32) -> EfcpConfig {
    EfcpConfig {
        in_order: true,
        max_sdu_gap: Some(0),
        max_pdu_lifetime: ms(1000),
        max_reorder: 16,
        a_timer: ms(10),
        max_send_queue: 16,
        dtcp: Some(DtcpConfig {
            cc: None,
            window: None,
            rate: None,
            rtx: Some(RtxConfig {
                initial_rto: ms(100),
                min_rto: ms(10),
                max_rto: ms(400),
                max_retries,
                ack_every: 0,
            }),
        }),
    }
}

#[test]
fn connection_backs_off_and_applies_karns_rule() {
    let mut a = Connection::new(rtx_only(10), t(0)).unwrap();
    a.write(t(0), sdu(0)).unwrap();
    assert!(matches!(
        a.poll_transmit(t(0)),
        Some(Pdu::Data {
            seq: 1,
            drf: true,
            ..
        })
    ));
    // No ack: the timer fires after 100, then 200, 400, 400 (capped).
    let mut expiries = Vec::new();
    for _ in 0..4 {
        let d = a.poll_timeout().unwrap();
        expiries.push(d);
        a.handle_timeout(d);
        assert!(matches!(
            a.poll_transmit(d),
            Some(Pdu::Data {
                seq: 1,
                drf: true,
                ..
            })
        ));
    }
    assert_eq!(expiries, vec![t(100), t(300), t(700), t(1100)]);
    assert_eq!(a.stats().rto, ms(400));
    // The ack for the retransmitted PDU gives no sample (Karn) but resets
    // the back-off.
    a.on_pdu(
        t(1150),
        Pdu::Ack {
            ctrl_seq: 1,
            ack_sn: 1,
        },
    );
    assert_eq!(a.stats().srtt, None);
    assert_eq!(a.stats().rto, ms(100));
    assert_eq!(a.poll_timeout(), None);
    // A clean exchange gives a sample.
    a.write(t(1200), sdu(1)).unwrap();
    assert!(matches!(
        a.poll_transmit(t(1200)),
        Some(Pdu::Data {
            seq: 2,
            drf: false,
            ..
        })
    ));
    a.on_pdu(
        t(1260),
        Pdu::Ack {
            ctrl_seq: 2,
            ack_sn: 2,
        },
    );
    assert_eq!(a.stats().srtt, Some(ms(60)));
    assert_eq!(a.stats().rttvar, ms(30));
    assert_eq!(a.stats().rto, ms(180));
    // A stale ack (old control sequence number) is ignored.
    a.on_pdu(
        t(1270),
        Pdu::Ack {
            ctrl_seq: 2,
            ack_sn: 2,
        },
    );
    assert_eq!(a.stats().ctrl_stale, 1);
    assert_eq!(a.stats().rto_expirations, 4);
    assert_eq!(a.stats().pdus_retransmitted, 4);
}

#[test]
fn three_duplicate_acks_trigger_fast_retransmit() {
    let mut a = Connection::new(rtx_only(10), t(0)).unwrap();
    for i in 0..5 {
        a.write(t(0), sdu(i)).unwrap();
    }
    while a.poll_transmit(t(0)).is_some() {}
    for c in 1..=4 {
        a.on_pdu(
            t(10),
            Pdu::Ack {
                ctrl_seq: c,
                ack_sn: 1,
            },
        );
    }
    assert_eq!(a.stats().fast_retransmits, 1);
    assert!(matches!(
        a.poll_transmit(t(10)),
        Some(Pdu::Data { seq: 2, .. })
    ));
    // Partial ack: the next hole goes at once.
    a.on_pdu(
        t(20),
        Pdu::Ack {
            ctrl_seq: 5,
            ack_sn: 3,
        },
    );
    assert!(matches!(
        a.poll_transmit(t(20)),
        Some(Pdu::Data { seq: 4, .. })
    ));
    a.on_pdu(
        t(30),
        Pdu::Ack {
            ctrl_seq: 6,
            ack_sn: 5,
        },
    );
    assert_eq!(a.in_flight(), 0);
    assert_eq!(a.poll_timeout(), None);
}

// 5. A-timer.
#[test]
fn delayed_ack_within_a_timer_covers_several_pdus() {
    let mut b = Connection::new(rtx_only(5), t(0)).unwrap();
    for (i, at) in [0u64, 1, 2].into_iter().enumerate() {
        b.on_pdu(
            t(at),
            Pdu::Data {
                seq: i as u64 + 1,
                drf: i == 0,
                payload: sdu(i as u64).into(),
            },
        );
        assert_eq!(b.poll_transmit(t(at)), None, "no ack before A");
    }
    assert_eq!(
        b.poll_timeout(),
        Some(t(10)),
        "A after the first unacked PDU"
    );
    b.handle_timeout(t(10));
    assert_eq!(
        b.poll_transmit(t(10)),
        Some(Pdu::Ack {
            ctrl_seq: 1,
            ack_sn: 3
        })
    );
    assert_eq!(b.poll_transmit(t(10)), None);
    assert_eq!(b.stats().acks_sent, 1);
    // Out of order: ack at once (duplicate ack for the sender).
    b.on_pdu(
        t(11),
        Pdu::Data {
            seq: 5,
            drf: false,
            payload: sdu(4).into(),
        },
    );
    assert_eq!(
        b.poll_transmit(t(11)),
        Some(Pdu::Ack {
            ctrl_seq: 2,
            ack_sn: 3
        })
    );
    // Hole filled: at once, cumulative over both.
    b.on_pdu(
        t(12),
        Pdu::Data {
            seq: 4,
            drf: false,
            payload: sdu(3).into(),
        },
    );
    assert_eq!(
        b.poll_transmit(t(12)),
        Some(Pdu::Ack {
            ctrl_seq: 3,
            ack_sn: 5
        })
    );
    let seqs: Vec<u64> = std::iter::from_fn(|| b.poll_deliver())
        .map(|d| d.seq)
        .collect();
    assert_eq!(seqs, vec![1, 2, 3, 4, 5]);
}

#[test]
fn ack_every_n_acks_at_once() {
    let mut cfg = rtx_only(5);
    cfg.dtcp.as_mut().unwrap().rtx.as_mut().unwrap().ack_every = 2;
    let mut b = Connection::new(cfg, t(0)).unwrap();
    b.on_pdu(
        t(0),
        Pdu::Data {
            seq: 1,
            drf: true,
            payload: vec![].into(),
        },
    );
    assert_eq!(b.poll_transmit(t(0)), None);
    b.on_pdu(
        t(1),
        Pdu::Data {
            seq: 2,
            drf: false,
            payload: vec![].into(),
        },
    );
    assert_eq!(
        b.poll_transmit(t(1)),
        Some(Pdu::Ack {
            ctrl_seq: 1,
            ack_sn: 2
        })
    );
}

#[test]
fn a_timer_bounds_ack_delay_over_a_transfer() {
    // Every data PDU that arrives in order is covered by an ack sent within
    // A (no ack_every), and acks are cumulative over several PDUs.
    let mut cfg = reliable_cfg();
    cfg.dtcp.as_mut().unwrap().rtx.as_mut().unwrap().ack_every = 0;
    let a_timer = cfg.a_timer;
    let mut sim = Sim::new(cfg, Channel::new(9, ms(2)), Channel::new(10, ms(2)));
    sim.log_a = true;
    sim.log_b = true;
    assert_eq!(
        transfer(&mut sim, 500, t(100_000)),
        (0..500).collect::<Vec<_>>()
    );
    let acks: Vec<(Instant, u64)> = sim
        .b_log
        .iter()
        .filter_map(|(at, p)| match p {
            Pdu::AckFc { ack_sn, .. } => Some((*at, *ack_sn)),
            _ => None,
        })
        .collect();
    let mut worst = Duration::ZERO;
    for (at, p) in &sim.a_log {
        if let Pdu::Data { seq, .. } = p {
            let arrival = *at + ms(2);
            let (acked_at, _) = acks.iter().find(|(_, a)| a >= seq).expect("acked");
            worst = worst.max(*acked_at - arrival);
        }
    }
    eprintln!(
        "A-timer {a_timer:?}: 500 PDUs, {} acks, worst ack delay {worst:?}",
        acks.len()
    );
    assert!(worst <= a_timer, "ack delayed {worst:?} > A {a_timer:?}");
    assert!((acks.len() as u64) < 500 / 2, "acks are cumulative");
}

// 6. Rate-based flow control.
#[test]
fn rate_limit_holds_per_frame() {
    let cfg = EfcpConfig {
        in_order: false,
        max_sdu_gap: None,
        max_pdu_lifetime: ms(1000),
        max_reorder: 16,
        a_timer: ms(5),
        max_send_queue: 1000,
        dtcp: Some(DtcpConfig {
            cc: None,
            window: None,
            rate: Some(RateFc {
                pdus_per_frame: 5,
                frame: ms(10),
            }),
            rtx: None,
        }),
    };
    let mut sim = Sim::new(cfg, Channel::new(1, ms(1)), Channel::new(2, ms(1)));
    sim.log_a = true;
    let mut written = 0u64;
    sim.run(t(1000), |s| {
        while s.a.can_write() {
            s.a.write(s.now, sdu(written)).unwrap();
            written += 1;
        }
        while s.b.poll_deliver().is_some() {}
        (false, None)
    });
    let mut per_frame: BTreeMap<u64, u64> = BTreeMap::new();
    for (at, p) in &sim.a_log {
        if matches!(p, Pdu::Data { .. }) && *at < t(1000) {
            *per_frame.entry(at.as_nanos() / 10_000_000).or_default() += 1;
        }
    }
    let total: u64 = per_frame.values().sum();
    eprintln!(
        "rate 5 per 10 ms over 1 s: {total} PDUs in {} frames, max per frame {}",
        per_frame.len(),
        per_frame.values().max().unwrap()
    );
    assert!(per_frame.values().all(|c| *c <= 5));
    assert_eq!(total, 500, "the full rate is used");
}

// 7. Retries exhausted.
#[test]
fn max_retries_exhausted_fails_the_connection() {
    let mut sim = Sim::new(
        rtx_only(3),
        Channel::new(1, ms(5)).lossy(1.0),
        Channel::new(2, ms(5)),
    );
    sim.a.write(Instant::ZERO, sdu(0)).unwrap();
    sim.a.write(Instant::ZERO, sdu(1)).unwrap();
    let ok = sim.run(t(60_000), |s| (s.a.is_failed(), None));
    assert!(ok);
    assert_eq!(
        sim.a.failure(),
        Some(&EfcpError::RetriesExhausted { seq: 1, retries: 3 })
    );
    // 100 + 200 + 400 + 400 ms of back-off.
    assert_eq!(sim.now, t(1100));
    assert_eq!(sim.a.stats().rto_expirations, 4);
    assert_eq!(sim.a.stats().pdus_retransmitted, 3);
    assert_eq!(sim.a.write(sim.now, sdu(9)), Err(EfcpError::Closed));
    assert!(!sim.a.can_write());
    assert_eq!(sim.a.poll_timeout(), None);
    assert_eq!(sim.a.poll_transmit(sim.now), None);
}

// Data runs and inactivity.
#[test]
fn idle_sender_starts_a_new_run_and_receiver_resets() {
    let cfg = reliable_cfg();
    let delta = cfg.delta_t();
    let mut sim = Sim::new(cfg, Channel::new(1, ms(3)), Channel::new(2, ms(3)));
    assert_eq!(
        transfer(&mut sim, 10, t(10_000)),
        (0..10).collect::<Vec<_>>()
    );
    assert_eq!(sim.b.stats().runs_started, 1);
    // Idle for 3Δ: the receiver forgets its run after 2Δ, the sender marks
    // its next PDU with DRF.
    let later = sim.now + delta * 3;
    sim.run(later, |_| (false, None));
    assert_eq!(sim.b.stats().inactivity_resets, 1);
    assert_eq!(sim.b.receive_lwe(), None);
    sim.now = later;
    let got = transfer(&mut sim, 10, later + ms(10_000));
    assert_eq!(got, (0..10).collect::<Vec<_>>());
    assert_eq!(sim.a.stats().runs_sent, 2);
    assert_eq!(sim.b.stats().runs_started, 2);
    assert_eq!(sim.b.receive_lwe(), Some(20));
}

#[test]
fn lost_drf_does_not_block_an_unreliable_flow() {
    let mut b = Connection::new(EfcpConfig::unreliable(), t(0)).unwrap();
    b.on_pdu(
        t(1),
        Pdu::Data {
            seq: 2,
            drf: false,
            payload: sdu(2).into(),
        },
    );
    b.on_pdu(
        t(2),
        Pdu::Data {
            seq: 3,
            drf: false,
            payload: sdu(3).into(),
        },
    );
    assert_eq!(b.poll_deliver().map(|d| d.seq), Some(2));
    assert_eq!(b.poll_deliver().map(|d| d.seq), Some(3));
    // Reliable flows hold what follows until the (retransmitted) DRF PDU
    // arrives, then deliver the whole run at once.
    let mut r = Connection::new(rtx_only(3), t(0)).unwrap();
    for seq in [3, 2] {
        r.on_pdu(
            t(1),
            Pdu::Data {
                seq,
                drf: false,
                payload: sdu(seq).into(),
            },
        );
    }
    assert_eq!(r.poll_deliver(), None);
    assert_eq!(r.stats().held_no_run, 2);
    assert_eq!(r.stats().dropped_no_run, 0);
    r.on_pdu(
        t(2),
        Pdu::Data {
            seq: 1,
            drf: true,
            payload: sdu(1).into(),
        },
    );
    let got: Vec<u64> = std::iter::from_fn(|| r.poll_deliver().map(|d| d.seq)).collect();
    assert_eq!(got, vec![1, 2, 3]);
}

#[test]
fn the_largest_sequence_number_is_garbage_and_cannot_end_a_flow() {
    // With 8-byte sequence numbers on the wire, a forged PDU may carry
    // u64::MAX; after an idle spell, when any number may start a run, it
    // must not become the run's base (nothing after it would be taken,
    // and the in-order test's `lwe + 1` would overflow).
    let mut b = Connection::new(EfcpConfig::unreliable(), t(0)).unwrap();
    let idle = t(3_600_000);
    b.on_pdu(
        idle,
        Pdu::Data {
            seq: u64::MAX,
            drf: true,
            payload: sdu(1).into(),
        },
    );
    assert_eq!(b.poll_deliver(), None, "not delivered");
    assert_eq!(b.stats().duplicates, 1, "counted as garbage");
    // The sender's real PDUs, each offered the in-order way first as the
    // normal IPCP does, are all taken.
    let mut got = Vec::new();
    for seq in [5, 6, 7] {
        if b.take_in_order(idle, seq, false) {
            got.push(seq);
            continue;
        }
        b.on_pdu(
            idle,
            Pdu::Data {
                seq,
                drf: seq == 5,
                payload: sdu(seq).into(),
            },
        );
        got.extend(std::iter::from_fn(|| b.poll_deliver().map(|d| d.seq)));
    }
    assert_eq!(got, vec![5, 6, 7]);
}

#[test]
fn take_in_order_refuses_the_largest_sequence_number() {
    // The ordinary way counts a data PDU numbered u64::MAX as garbage
    // (361a7ed); the short way in must not take it either.
    let forged_at = |direct: bool| {
        let mut b = Connection::new(EfcpConfig::unreliable(), t(0)).unwrap();
        let idle = t(3_600_000);
        b.on_pdu(
            idle,
            Pdu::Data {
                seq: u64::MAX - 1,
                drf: true,
                payload: sdu(1).into(),
            },
        );
        while b.poll_deliver().is_some() {}
        let taken = direct && b.take_in_order(idle, u64::MAX, false);
        if !taken {
            b.on_pdu(
                idle,
                Pdu::Data {
                    seq: u64::MAX,
                    drf: false,
                    payload: sdu(2).into(),
                },
            );
            while b.poll_deliver().is_some() {}
        }
        (
            taken,
            b.receive_lwe(),
            b.stats().delivered,
            b.stats().duplicates,
        )
    };
    let slow = forged_at(false);
    let fast = forged_at(true);
    assert!(!fast.0, "take_in_order took seq u64::MAX");
    assert_eq!(fast, slow, "short way and ordinary way disagree");
}

#[test]
fn reorder_queue_is_bounded() {
    let mut cfg = rtx_only(3);
    cfg.max_reorder = 4;
    let mut b = Connection::new(cfg, t(0)).unwrap();
    b.on_pdu(
        t(0),
        Pdu::Data {
            seq: 1,
            drf: true,
            payload: vec![].into(),
        },
    );
    for s in 3..=6 {
        b.on_pdu(
            t(0),
            Pdu::Data {
                seq: s,
                drf: false,
                payload: vec![].into(),
            },
        );
    }
    assert_eq!(b.stats().dropped_queue, 0);
    b.on_pdu(
        t(0),
        Pdu::Data {
            seq: 7,
            drf: false,
            payload: vec![].into(),
        },
    );
    // Past the queue is past what such a sender keeps unacknowledged:
    // out of window.
    assert_eq!(b.stats().out_of_window, 1);
    assert_eq!(b.stats().dropped_queue, 0);
    assert_eq!(b.receiver_buffered(), 5, "1 ready + 4 held");
}

#[test]
fn config_validation() {
    let mut c = EfcpConfig::unreliable();
    c.max_sdu_gap = Some(0);
    assert_eq!(c.validate(), Err(ConfigError::NoLossWithoutRtx));
    let mut c = EfcpConfig::reliable();
    c.dtcp
        .as_mut()
        .unwrap()
        .window
        .as_mut()
        .unwrap()
        .initial_credit = 1000;
    assert!(matches!(
        c.validate(),
        Err(ConfigError::BadInitialCredit { .. })
    ));
    let mut c = EfcpConfig::reliable();
    c.dtcp.as_mut().unwrap().rtx.as_mut().unwrap().min_rto = Duration::ZERO;
    assert_eq!(c.validate(), Err(ConfigError::BadRto));
    assert!(EfcpConfig::reliable().validate().is_ok());
    let fc = EfcpConfig::flow_controlled();
    assert!(fc.validate().is_ok());
    assert!(fc.window().is_some() && fc.rtx().is_none());
    assert!(matches!(
        Connection::new(
            EfcpConfig {
                max_send_queue: 0,
                ..EfcpConfig::unreliable()
            },
            t(0)
        ),
        Err(EfcpError::Config(ConfigError::ZeroSendQueue))
    ));
}

#[test]
fn widen_seq_picks_the_nearest() {
    assert_eq!(widen_seq(0x1_0000_0005, 0x0000_0007, 32), 0x1_0000_0007);
    assert_eq!(widen_seq(0x1_FFFF_FFF0, 0x0000_0003, 32), 0x2_0000_0003);
    assert_eq!(widen_seq(0x2_0000_0003, 0xFFFF_FFF0, 32), 0x1_FFFF_FFF0);
    assert_eq!(widen_seq(5, 0xFFFF_FFF0, 32), 0xFFFF_FFF0);
    assert_eq!(widen_seq(77, 12345, 64), 12345);
}

// 8. Random loss, duplication and reordering never break a reliable flow.
proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]
    #[test]
    fn reliable_flow_delivers_exactly_what_was_written(
        seed in proptest::prelude::any::<u64>(),
        loss in 0.0f64..0.3,
        dup in 0.0f64..0.2,
        jitter_ms in 0u64..20,
        n in 1u64..300,
        credit in 1u64..16,
        window in proptest::prelude::any::<bool>(),
    ) {
        let mut cfg = reliable_cfg();
        let d = cfg.dtcp.as_mut().unwrap();
        if window {
            d.window = Some(WindowFc { initial_credit: credit, max_closed_queue: 4, receiver_buffer: 16 });
        } else {
            d.window = None;
            cfg.max_reorder = credit as usize;
        }
        let mut ab = Channel::new(seed, ms(3)).lossy(loss);
        ab.dup = dup;
        ab.jitter = ms(jitter_ms);
        let mut ba = Channel::new(seed ^ 0x5555, ms(3)).lossy(loss);
        ba.dup = dup;
        ba.jitter = ms(jitter_ms);
        let mut sim = Sim::new(cfg, ab, ba);
        let got = transfer(&mut sim, n, t(3_600_000));
        proptest::prop_assert_eq!(got, (0..n).collect::<Vec<_>>());
    }
}

// Forged and replayed PDUs: what arrives is checked against what the peer
// may have sent, without any cryptography.

fn data(seq: u64, drf: bool) -> Pdu {
    Pdu::Data {
        seq,
        drf,
        payload: sdu(999_999).into(),
    }
}

/// The data PDUs in a log, in order.
fn logged_data(log: &[(Instant, Pdu)]) -> Vec<Pdu> {
    log.iter()
        .filter(|(_, p)| matches!(p, Pdu::Data { .. }))
        .map(|(_, p)| p.clone())
        .collect()
}

#[test]
fn a_forged_drf_far_ahead_neither_restarts_the_run_nor_stalls_the_flow() {
    let mut sim = Sim::new(
        reliable_cfg(),
        Channel::new(1, ms(3)),
        Channel::new(2, ms(3)),
    );
    assert_eq!(
        transfer(&mut sim, 10, t(10_000)),
        (0..10).collect::<Vec<_>>()
    );
    let now = sim.now;
    // The 36-byte attack: DRF set, sequence number 1,000,000.
    sim.b.on_pdu(now, data(1_000_000, true));
    assert_eq!(sim.b.stats().out_of_window, 1);
    assert_eq!(sim.b.stats().runs_started, 1);
    assert_eq!(sim.b.receive_lwe(), Some(10));
    assert_eq!(sim.b.poll_transmit(now), None, "no answer to a forged PDU");
    assert_eq!(sim.b.poll_deliver(), None);
    // Just past the advertised window is out of window too; within it is
    // taken (it could be genuine).
    let rwe = sim.a.send_rwe().unwrap();
    sim.b.on_pdu(now, data(rwe + 1, true));
    assert_eq!(sim.b.stats().out_of_window, 2);
    let until = now + ms(10_000);
    assert_eq!(transfer(&mut sim, 10, until), (0..10).collect::<Vec<_>>());
    assert_eq!(sim.a.stats().failures, 0);
    assert_eq!(sim.b.receive_lwe(), Some(20));
}

#[test]
fn a_forged_drf_before_the_first_pdu_is_out_of_window() {
    let mut b = Connection::new(reliable_cfg(), t(0)).unwrap();
    b.on_pdu(t(0), data(1_000_000, true));
    assert_eq!(b.stats().out_of_window, 1);
    assert_eq!(b.receive_lwe(), None);
    b.on_pdu(t(1), data(1, true));
    assert_eq!(b.receive_lwe(), Some(1));
    // A peer whose first sequence number is unknown may start anywhere.
    let mut c = Connection::with_initial_seq(reliable_cfg(), t(0), 1).unwrap();
    c.on_pdu(t(0), data(5_000, true));
    assert_eq!(c.receive_lwe(), Some(5_000));
}

fn replay_after_idle(cfg: EfcpConfig) {
    let delta = cfg.delta_t();
    let mut sim = Sim::new(cfg, Channel::new(1, ms(3)), Channel::new(2, ms(3)));
    sim.log_a = true;
    assert_eq!(
        transfer(&mut sim, 10, t(10_000)),
        (0..10).collect::<Vec<_>>()
    );
    let captured = logged_data(&sim.a_log);
    assert_eq!(captured.len(), 10);
    // Idle past the receiver's inactivity timer: the run is gone.
    let later = sim.now + delta * 3;
    sim.run(later, |_| (false, None));
    assert_eq!(sim.b.stats().inactivity_resets, 1);
    assert_eq!(sim.b.receive_lwe(), None);
    sim.now = later;
    let dups = sim.b.stats().duplicates;
    for p in &captured {
        sim.b.on_pdu(later, p.clone());
    }
    assert_eq!(sim.b.poll_deliver(), None, "a replay is never delivered");
    assert_eq!(sim.b.stats().duplicates, dups + 10);
    assert_eq!(sim.b.stats().runs_started, 1);
    assert_eq!(sim.b.receive_lwe(), None);
    // The genuine sender's next run is taken.
    let got = transfer(&mut sim, 10, later + ms(10_000));
    assert_eq!(got, (0..10).collect::<Vec<_>>());
    assert_eq!(sim.b.stats().runs_started, 2);
    assert_eq!(sim.b.receive_lwe(), Some(20));
}

#[test]
fn a_replayed_run_after_inactivity_is_not_delivered_again_reliable() {
    replay_after_idle(reliable_cfg());
}

#[test]
fn a_replayed_run_after_inactivity_is_not_delivered_again_unreliable() {
    replay_after_idle(EfcpConfig::unreliable());
}

#[test]
fn forged_control_pdus_are_counted_and_change_nothing() {
    let mut sim = Sim::new(
        reliable_cfg(),
        Channel::new(1, ms(3)),
        Channel::new(2, ms(3)),
    );
    assert_eq!(
        transfer(&mut sim, 10, t(10_000)),
        (0..10).collect::<Vec<_>>()
    );
    // Something in flight, so an ack could do harm.
    let now = sim.now;
    for i in 0..5 {
        sim.a.write(now, sdu(100 + i)).unwrap();
    }
    while let Some(p) = sim.a.poll_transmit(now) {
        drop(p); // lost
    }
    assert_eq!(sim.a.in_flight(), 5);
    let next = sim.a.next_seq();
    let rwe = sim.a.send_rwe().unwrap();
    let invalid = sim.a.stats().ctrl_invalid;
    let forged = [
        // Acks for what was never sent.
        Pdu::Ack {
            ctrl_seq: 1_000,
            ack_sn: next,
        },
        Pdu::AckFc {
            ctrl_seq: 1_001,
            ack_sn: next + 1_000_000,
            new_rwe: rwe + 1,
            rate: 0,
            frame_ms: 0,
        },
        // Credit no receiver could grant.
        Pdu::Fc {
            ctrl_seq: 1_002,
            new_rwe: next + 1_000_000,
            rate: 0,
            frame_ms: 0,
        },
        // A plausible duplicate ack whose control sequence number would make
        // every genuine control PDU stale.
        Pdu::Ack {
            ctrl_seq: u64::MAX - 1,
            ack_sn: next - 6,
        },
    ];
    for p in forged {
        sim.a.on_pdu(now, p);
    }
    assert_eq!(sim.a.stats().ctrl_invalid, invalid + 4);
    assert_eq!(sim.a.in_flight(), 5);
    assert_eq!(sim.a.send_rwe(), Some(rwe));
    // A rate from a PDU: this connection runs no rate control.
    sim.a.on_pdu(
        now,
        Pdu::Fc {
            ctrl_seq: 2_000,
            new_rwe: rwe,
            rate: 1,
            frame_ms: 60_000,
        },
    );
    // A rendezvous claiming data beyond the window.
    let b_invalid = sim.b.stats().ctrl_invalid;
    sim.b.on_pdu(
        now,
        Pdu::Rendezvous {
            ctrl_seq: 5,
            next_seq: 1_000_000,
        },
    );
    assert_eq!(sim.b.stats().ctrl_invalid, b_invalid + 1);
    assert_eq!(sim.b.receive_lwe(), Some(10));
    // The lost PDUs are retransmitted and the flow goes on at full speed.
    let stale = sim.a.stats().ctrl_stale;
    let until = now + ms(10_000);
    let mut got = Vec::new();
    let ok = sim.run(until, |s| {
        while let Some(d) = s.b.poll_deliver() {
            got.push(sdu_index(&d.payload));
            s.b.consumed(s.now, 1);
        }
        (got.len() == 5 && s.a.in_flight() == 0, None)
    });
    assert!(ok, "{:?}", sim.a.stats());
    assert_eq!(got, (100..105).collect::<Vec<_>>());
    assert!(sim.now < now + ms(1_000), "no rate of 1 PDU a minute");
    // The forged FC's ctrl_seq 2_000 was within the jump bound and taken,
    // so b's genuine control PDUs arrived stale: they still counted for
    // their cumulative fields (the acks above).
    assert!(sim.a.stats().ctrl_stale > stale);
    assert_eq!(sim.a.stats().failures, 0);
}

#[test]
fn a_flood_of_forged_and_replayed_pdus_does_not_stop_a_lossy_reliable_transfer() {
    let ab = Channel::new(11, ms(5)).lossy(0.05);
    let ba = Channel::new(12, ms(5)).lossy(0.05);
    let mut sim = Sim::new(reliable_cfg(), ab, ba);
    sim.log_a = true;
    sim.log_b = true;
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let n = 2_000u64;
    let mut written = 0u64;
    let mut got = Vec::new();
    let mut forged = 0u64;
    let ok = sim.run(t(120_000), |s| {
        while written < n && s.a.can_write() {
            s.a.write(s.now, sdu(written)).unwrap();
            written += 1;
        }
        while let Some(d) = s.b.poll_deliver() {
            got.push(sdu_index(&d.payload));
            s.b.consumed(s.now, 1);
        }
        // Ten forged or replayed PDUs at every event, at both ends.
        for _ in 0..10 {
            forged += 1;
            let far = s.a.next_seq() + rng.gen_range(100_000..u64::MAX / 4);
            let to_b = match rng.gen_range(0..4) {
                0 => data(far, rng.gen_bool(0.5)),
                1 => Pdu::Rendezvous {
                    ctrl_seq: rng.gen(),
                    next_seq: far,
                },
                _ => match logged_data(&s.a_log).get(rng.gen_range(0..s.a_log.len().max(1))) {
                    Some(p) => p.clone(),
                    None => data(far, true),
                },
            };
            s.b.on_pdu(s.now, to_b);
            let to_a = match rng.gen_range(0..4) {
                0 => Pdu::Ack {
                    ctrl_seq: rng.gen(),
                    ack_sn: far,
                },
                1 => Pdu::AckFc {
                    ctrl_seq: rng.gen(),
                    ack_sn: far,
                    new_rwe: far,
                    rate: 1,
                    frame_ms: 60_000,
                },
                2 => Pdu::Fc {
                    ctrl_seq: rng.gen(),
                    new_rwe: far,
                    rate: 1,
                    frame_ms: 60_000,
                },
                _ => match s.b_log.get(rng.gen_range(0..s.b_log.len().max(1))) {
                    Some((_, p)) => p.clone(),
                    None => data(far, true),
                },
            };
            s.a.on_pdu(s.now, to_a);
        }
        (got.len() as u64 == n && s.a.in_flight() == 0, None)
    });
    assert!(
        ok,
        "stalled at {} of {n}: a {:?} b {:?}",
        got.len(),
        sim.a.stats(),
        sim.b.stats()
    );
    assert_eq!(got, (0..n).collect::<Vec<_>>(), "exactly once, in order");
    assert!(forged > 10_000);
    assert!(sim.b.stats().out_of_window > 1_000);
    assert!(sim.a.stats().ctrl_invalid > 1_000);
    assert_eq!(sim.b.stats().runs_started, 1);
}

#[test]
fn an_unreliable_flow_drops_a_far_jump_but_resynchronises_after_two_delta() {
    let cfg = EfcpConfig::unreliable();
    let inactivity = cfg.delta_t() * 2;
    let mut b = Connection::new(cfg, t(0)).unwrap();
    for s in 1..=5 {
        b.on_pdu(t(s), data(s, s == 1));
    }
    b.on_pdu(t(6), data(1_000_000, true));
    assert_eq!(b.stats().out_of_window, 1);
    b.on_pdu(t(7), data(6, false));
    assert_eq!(b.receive_lwe(), Some(6));
    // A sender that really lost more than the bound: after 2Δ with nothing
    // taken, the receiver follows it.
    let far = 6 + MAX_UNRELIABLE_JUMP + 10;
    b.on_pdu(t(8), data(far, false));
    assert_eq!(b.stats().out_of_window, 2);
    let later = t(7) + inactivity;
    b.on_pdu(later, data(far + 1, false));
    assert_eq!(b.receive_lwe(), Some(far + 1));
    let got: Vec<u64> = std::iter::from_fn(|| b.poll_deliver().map(|d| d.seq)).collect();
    assert_eq!(got, vec![1, 2, 3, 4, 5, 6, far + 1]);
}

/// A cube's EFCP told as tuning keys gives the same EFCP when applied to
/// the cube's kind, and reads as `key=value`s `rinactl efcp` takes.
#[test]
fn efcp_told_as_tuning_keys_applies_back_to_itself() {
    for base in [
        EfcpConfig::unreliable(),
        EfcpConfig::reliable(),
        EfcpConfig::flow_controlled(),
    ] {
        let mut changed = base.clone();
        EfcpTuning {
            a_timer_ms: Some(7),
            max_retries: base.rtx().map(|_| 5),
            window: base.window().map(|_| 40),
            rate_pdus: base.dtcp.as_ref().map(|_| 100),
            ..EfcpTuning::default()
        }
        .apply(&mut changed)
        .unwrap();
        let told = EfcpTuning::of(&changed);
        let mut again = base.clone();
        told.apply(&mut again).unwrap();
        assert_eq!(again, changed, "{told}");
        let line = told.to_string();
        assert!(line.contains("a_timer_ms=7"), "{line}");
        assert_eq!(
            line.contains("max_retries=5"),
            base.rtx().is_some(),
            "{line}"
        );
    }
    let line = EfcpTuning::of(&EfcpConfig::reliable()).to_string();
    assert!(line.contains("congestion_control="), "{line}");
}
