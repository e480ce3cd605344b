//! Stress tests with explicit time: SDUs of random sizes, cut by delimiting
//! into fragments, between two connections over links that lose,
//! duplicate, reorder, delay and ECN-mark PDUs in both directions (data
//! and control alike), loss only until a given time; every sequence number
//! cut to the wire's field widths on the way and widened back on arrival
//! the way the normal IPCP does, so narrow widths wrap many times.

use super::*;
use crate::delimiting::{fragment, Reassembler};
use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn at(ms_: u64) -> Instant {
    Instant::ZERO + ms(ms_)
}

/// What a link does to the PDUs it carries.
#[derive(Debug, Clone, Copy)]
struct Net {
    delay: Duration,
    /// Uniform extra delay in `[0, jitter)`: reorders.
    jitter: Duration,
    /// Loss probability, until `lossy_until`.
    loss: f64,
    dup: f64,
    /// Probability that a data PDU gets the ECN mark.
    ecn: f64,
    lossy_until: Instant,
}

/// One direction.
struct Link {
    net: Net,
    rng: ChaCha8Rng,
    queue: BTreeMap<(Instant, u64), (Pdu, PduMeta)>,
    id: u64,
}

impl Link {
    fn new(net: Net, seed: u64) -> Self {
        Link {
            net,
            rng: ChaCha8Rng::seed_from_u64(seed),
            queue: BTreeMap::new(),
            id: 0,
        }
    }

    fn send(&mut self, now: Instant, pdu: Pdu, mut meta: PduMeta) {
        if now < self.net.lossy_until && self.rng.gen_bool(self.net.loss) {
            return;
        }
        if matches!(pdu, Pdu::Data { .. }) && self.rng.gen_bool(self.net.ecn) {
            meta.ecn = true;
        }
        let copies = 1 + usize::from(self.rng.gen_bool(self.net.dup));
        for _ in 0..copies {
            let j = match self.net.jitter.as_nanos() as u64 {
                0 => 0,
                n => self.rng.gen_range(0..n),
            };
            let when = now + self.net.delay + Duration::from_nanos(j);
            self.queue.insert((when, self.id), (pdu.clone(), meta));
            self.id += 1;
        }
    }

    fn next(&self) -> Option<Instant> {
        self.queue.keys().next().map(|k| k.0)
    }

    fn pop_due(&mut self, now: Instant) -> Option<(Pdu, PduMeta)> {
        if self.next()? <= now {
            self.queue.pop_first().map(|(_, v)| v)
        } else {
            None
        }
    }
}

/// Widths of the sequence-number fields on the wire, in bits.
#[derive(Debug, Clone, Copy)]
struct Widths {
    seq: u32,
    ctrl: u32,
}

fn mask(v: u64, bits: u32) -> u64 {
    if bits >= 64 {
        v
    } else {
        v & ((1u64 << bits) - 1)
    }
}

/// A PDU as the normal IPCP writes it: every number cut to its field (the
/// echo of an ack travels in `my_lwe`, 0 meaning none).
fn to_wire(p: Pdu, mut meta: PduMeta, w: Widths) -> (Pdu, PduMeta) {
    let s = |v| mask(v, w.seq);
    let c = |v| mask(v, w.ctrl);
    meta.echo = meta.echo.map(s).filter(|&e| e != 0);
    (p.map_numbers(s, s, c), meta)
}

/// Hands a PDU from the wire to `c`, widened as the normal IPCP widens it.
fn from_wire(c: &mut Connection, now: Instant, p: Pdu, meta: PduMeta, w: Widths) {
    let (p, meta) = c.widen(p, meta, w.seq, w.ctrl);
    c.on_pdu_meta(now, p, meta);
}

/// Both ends and the links between them; `a` writes, `b` reads.
struct Pair {
    now: Instant,
    a: Connection,
    b: Connection,
    ab: Link,
    ba: Link,
    w: Widths,
}

impl Pair {
    fn new(cfg: &EfcpConfig, net: Net, seed: u64, w: Widths) -> Self {
        Pair {
            now: Instant::ZERO,
            a: Connection::new(cfg.clone(), Instant::ZERO).expect("valid config"),
            b: Connection::new(cfg.clone(), Instant::ZERO).expect("valid config"),
            ab: Link::new(net, seed),
            ba: Link::new(net, seed ^ 0x9e37_79b9),
            w,
        }
    }

    fn pump(&mut self) {
        while let Some((p, m)) = self.a.poll_transmit_meta(self.now) {
            let (p, m) = to_wire(p, m, self.w);
            self.ab.send(self.now, p, m);
        }
        while let Some((p, m)) = self.b.poll_transmit_meta(self.now) {
            let (p, m) = to_wire(p, m, self.w);
            self.ba.send(self.now, p, m);
        }
    }

    /// One event: time moves to the next one (not past `until`), PDUs due
    /// arrive, timers due run. False when nothing is left to happen before
    /// `until`.
    fn step(&mut self, until: Instant, wake: Option<Instant>) -> bool {
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
        let Some(next) = next.filter(|&n| n <= until) else {
            return false;
        };
        self.now = self.now.max(next);
        while let Some((p, m)) = self.ab.pop_due(self.now) {
            from_wire(&mut self.b, self.now, p, m, self.w);
        }
        while let Some((p, m)) = self.ba.pop_due(self.now) {
            from_wire(&mut self.a, self.now, p, m, self.w);
        }
        for c in [&mut self.a, &mut self.b] {
            if c.poll_timeout().is_some_and(|d| d <= self.now) {
                c.handle_timeout(self.now);
            }
        }
        true
    }
}

/// SDU `i` of `len` bytes: its index, then bytes derived from it.
fn make_sdu(i: u64, len: usize) -> Vec<u8> {
    let mut v = i.to_be_bytes().to_vec();
    v.extend((0..len.saturating_sub(8)).map(|k| (i as usize * 31 + k * 7) as u8));
    v.truncate(len.max(8));
    v
}

/// The sender's side of a transfer: SDUs written whole (all their
/// fragments) as room allows.
struct Writer {
    sdus: Vec<Vec<u8>>,
    next: usize,
    max_payload: usize,
}

impl Writer {
    fn write(&mut self, c: &mut Connection, now: Instant) {
        while let Some(sdu) = self.sdus.get(self.next) {
            let mut frags = Vec::new();
            fragment(sdu, MAX_SDU, self.max_payload, &mut frags).expect("fragments");
            if c.write_capacity() < frags.len() {
                return;
            }
            for f in frags {
                c.write(now, f).expect("room was checked");
            }
            self.next += 1;
        }
    }
}

const MAX_SDU: usize = 4096;

/// The receiver's side: fragments reassembled, SDUs collected.
struct Reader {
    r: Reassembler,
    got: Vec<Vec<u8>>,
    seqs: Vec<u64>,
}

impl Reader {
    fn new() -> Self {
        Reader {
            r: Reassembler::new(MAX_SDU, Duration::from_secs(3600)),
            got: Vec::new(),
            seqs: Vec::new(),
        }
    }

    /// Takes what `c` delivers; returns how many fragments.
    fn read(&mut self, c: &mut Connection, now: Instant) -> usize {
        let mut n = 0;
        while let Some(d) = c.poll_deliver() {
            n += 1;
            self.seqs.push(d.seq);
            if let Some(sdu) = self.r.push(now, d.seq, &d.payload).expect("well formed") {
                self.got.push(sdu);
            }
        }
        n
    }
}

/// A reliable configuration small enough for 8-bit sequence numbers.
fn reliable(window: bool, cc: Option<CcConfig>, ack_every: u32, a_timer: u64) -> EfcpConfig {
    EfcpConfig {
        in_order: true,
        max_sdu_gap: Some(0),
        max_pdu_lifetime: ms(500),
        max_reorder: 32,
        a_timer: ms(a_timer),
        max_send_queue: 32,
        dtcp: Some(DtcpConfig {
            window: window.then_some(WindowFc {
                initial_credit: 16,
                max_closed_queue: 16,
                receiver_buffer: 48,
            }),
            rate: None,
            rtx: Some(RtxConfig {
                initial_rto: ms(100),
                min_rto: ms(10),
                max_rto: ms(1000),
                max_retries: 60,
                ack_every,
            }),
            cc,
        }),
    }
}

/// How long a flow may take to finish once its links stop losing.
const SETTLE: Duration = Duration::from_secs(30);

/// Runs a reliable transfer of `sdus` and checks every property on the
/// way: the receiver's buffer and the sender's memory stay within their
/// windows, and the transfer completes within [`SETTLE`] of the end of
/// loss. Returns the SDUs and fragment sequence numbers delivered, and
/// when the transfer completed.
fn reliable_transfer(
    cfg: &EfcpConfig,
    net: Net,
    seed: u64,
    w: Widths,
    sdus: Vec<Vec<u8>>,
    max_payload: usize,
) -> (Vec<Vec<u8>>, Vec<u64>, Pair) {
    let n = sdus.len();
    let mut p = Pair::new(cfg, net, seed, w);
    let mut wr = Writer {
        sdus,
        next: 0,
        max_payload,
    };
    let mut rd = Reader::new();
    let until = net.lossy_until + SETTLE;
    let buffer = cfg.window().map(|w| w.receiver_buffer);
    let closed = cfg
        .window()
        .map_or(cfg.max_send_queue, |w| w.max_closed_queue);
    let flight = buffer.unwrap_or(cfg.max_reorder + 1);
    loop {
        wr.write(&mut p.a, p.now);
        let k = rd.read(&mut p.b, p.now);
        p.b.consumed(p.now, k);
        if let Some(b) = buffer {
            assert!(p.b.receiver_buffered() <= b, "receiver overrun");
        }
        assert!(
            p.a.in_flight() <= flight,
            "{} in flight, window {flight}",
            p.a.in_flight()
        );
        assert!(p.a.send_queue_len() <= closed + flight);
        assert!(!p.a.is_failed(), "failed: {:?}", p.a.failure());
        if rd.got.len() == n && p.a.in_flight() == 0 {
            return (rd.got, rd.seqs, p);
        }
        if !p.step(until, None) {
            panic!(
                "stalled at {} of {n} SDUs, {:?} (loss until {:?})\n{}\nsender {:?}\nreceiver {:?}",
                rd.got.len(),
                p.now,
                net.lossy_until,
                debug_state(&p),
                p.a.stats(),
                p.b.stats()
            );
        }
    }
}

fn debug_state(p: &Pair) -> String {
    format!(
        "snd_una {} next_seq {} snd_rwe {:?} queued {} | rcv lwe {:?} buffered {} deliverable {} adv {}",
        p.a.next_seq() - p.a.in_flight() as u64,
        p.a.next_seq(),
        p.a.send_rwe(),
        p.a.send_queue_len(),
        p.b.receive_lwe(),
        p.b.receiver_buffered(),
        p.b.deliverable(),
        p.b.last_adv_rwe
    )
}

fn cc_choice() -> impl Strategy<Value = Option<CcConfig>> {
    prop_oneof![
        Just(None),
        Just(Some(CcConfig::default())),
        Just(Some(CcConfig::aimd())),
    ]
}

fn widths() -> impl Strategy<Value = Widths> {
    (
        prop_oneof![Just(8u32), Just(16), Just(32)],
        prop_oneof![Just(8u32), Just(16), Just(32)],
    )
        .prop_map(|(seq, ctrl)| Widths { seq, ctrl })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    /// Reliable in-order flows, with or without window and congestion
    /// control, at any field width: every SDU once, in order, intact;
    /// memory bounded by the windows; done soon after loss stops.
    #[test]
    fn reliable_sdus_arrive_once_in_order_intact(
        seed in any::<u64>(),
        loss in 0.0f64..0.3,
        dup in 0.0f64..0.2,
        delay in 2u64..10,
        jitter_pct in 0u64..100,
        ecn in 0.0f64..0.3,
        lossy_for in 0u64..3_000,
        sizes in proptest::collection::vec(1usize..1500, 1..80),
        max_payload in 60usize..400,
        window in any::<bool>(),
        cc in cc_choice(),
        ack_every in 0u32..4,
        a_timer in 0u64..10,
        w in widths(),
    ) {
        let net = Net {
            delay: ms(delay),
            jitter: ms(delay) * jitter_pct as u32 / 100,
            loss,
            dup,
            ecn,
            lossy_until: at(lossy_for),
        };
        let sdus: Vec<_> = sizes.iter().enumerate().map(|(i, &l)| make_sdu(i as u64, l)).collect();
        let cfg = reliable(window, cc, ack_every, a_timer);
        let (got, seqs, _) = reliable_transfer(&cfg, net, seed, w, sdus.clone(), max_payload);
        prop_assert_eq!(seqs.clone(), (1..=seqs.len() as u64).collect::<Vec<_>>());
        prop_assert!(got == sdus, "SDUs delivered differ from those written");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(6))]

    /// One-byte sequence numbers (data and control) over a long lossy run:
    /// the sequence space wraps dozens of times and nothing goes wrong.
    #[test]
    fn one_byte_sequence_numbers_wrap_many_times(
        seed in any::<u64>(),
        loss in 0.0f64..0.2,
        cc in cc_choice(),
        window in any::<bool>(),
    ) {
        let net = Net {
            delay: ms(4),
            jitter: ms(3),
            loss,
            dup: 0.05,
            ecn: 0.05,
            lossy_until: at(4_000),
        };
        let sdus: Vec<_> = (0..1500).map(|i| make_sdu(i, 8 + (i as usize * 37) % 300)).collect();
        let w = Widths { seq: 8, ctrl: 8 };
        let cfg = reliable(window, cc, 2, 3);
        let (got, seqs, p) = reliable_transfer(&cfg, net, seed, w, sdus.clone(), 120);
        prop_assert!(seqs.len() > 256 * 8, "only {} PDUs", seqs.len());
        prop_assert_eq!(seqs.clone(), (1..=seqs.len() as u64).collect::<Vec<_>>());
        prop_assert!(got == sdus);
        // Control numbers wrapped too and kept being taken as fresh (taken
        // as stale after their first wrap, no more than 255 would be).
        let st = p.a.stats();
        prop_assert!(st.acks_received > 3 * 256, "{:?}", st);
    }
}

#[test]
fn a_window_wider_than_the_reordering_queue_is_not_granted() {
    // Receiver buffer 128 over a reordering queue of 32: a PDU more than
    // 33 past the LWE is dropped, so the window granted stops there and
    // nothing the window lets the sender send is dropped for lack of room.
    // (Granted the whole buffer, every loss cost the PDUs sent more than
    // 33 past it as well, and recovery crawled at one PDU per round trip.)
    let mut cfg = reliable(true, None, 2, 3);
    if let Some(w) = cfg.dtcp.as_mut().and_then(|d| d.window.as_mut()) {
        w.receiver_buffer = 128;
    }
    let net = Net {
        delay: ms(4),
        jitter: ms(2),
        loss: 0.1,
        dup: 0.0,
        ecn: 0.0,
        lossy_until: at(2_000),
    };
    let sdus: Vec<_> = (0..3000).map(|i| make_sdu(i, 100)).collect();
    let w = Widths { seq: 32, ctrl: 32 };
    let (got, _, p) = reliable_transfer(&cfg, net, 5, w, sdus.clone(), 200);
    assert!(got == sdus);
    assert_eq!(p.b.stats().dropped_queue, 0, "{:?}", p.b.stats());
    assert!(p.now < at(4_000), "took until {:?}", p.now);
}

/// A reader that takes delivered SDUs but consumes them (frees their
/// buffer space) only in bursts: `burst` at a time every `every`, with a
/// long pause once.
struct SlowReader {
    every: Duration,
    burst: usize,
    pause_at: Instant,
    pause: Duration,
    next: Instant,
    pending: usize,
}

impl SlowReader {
    /// Consumes what is due at `now`; returns when it next wants to run.
    fn tick(&mut self, c: &mut Connection, now: Instant) -> Instant {
        if now >= self.next {
            let k = self.pending.min(self.burst);
            self.pending -= k;
            c.consumed(now, k);
            self.next = now + self.every;
            if now >= self.pause_at && !self.pause.is_zero() {
                self.next = now + self.pause;
                self.pause = Duration::ZERO;
            }
        }
        self.next
    }
}

/// Window flow control with a reader slower than the writer, pausing
/// once for longer than the receiver's inactivity time (2Δ), over a link
/// losing data and control PDUs alike: the receiver's buffer is never
/// overrun, and the flow neither stalls nor, with retransmission, loses
/// anything. Returns the SDUs delivered.
fn slow_reader_transfer(
    cfg: &EfcpConfig,
    net: Net,
    seed: u64,
    rd_cfg: (u64, usize, u64),
) -> Vec<Vec<u8>> {
    let n = 300;
    let sdus: Vec<_> = (0..n)
        .map(|i| make_sdu(i, 8 + (i as usize * 13) % 200))
        .collect();
    let w = Widths { seq: 16, ctrl: 16 };
    let mut p = Pair::new(cfg, net, seed, w);
    let mut wr = Writer {
        sdus,
        next: 0,
        max_payload: 100,
    };
    let mut rd = Reader::new();
    let (every, burst, pause_at) = rd_cfg;
    let mut slow = SlowReader {
        every: ms(every),
        burst,
        pause_at: at(pause_at),
        pause: cfg.delta_t() * 10,
        next: Instant::ZERO,
        pending: 0,
    };
    let buffer = cfg.window().expect("window").receiver_buffer;
    let until = net.lossy_until + slow.pause + SETTLE;
    loop {
        wr.write(&mut p.a, p.now);
        slow.pending += rd.read(&mut p.b, p.now);
        let wake = slow.tick(&mut p.b, p.now);
        assert!(p.b.receiver_buffered() <= buffer, "receiver overrun");
        assert!(!p.a.is_failed(), "failed: {:?}", p.a.failure());
        let done = wr.next == n as usize && p.a.send_queue_len() == 0 && p.a.in_flight() == 0;
        if done && p.b.deliverable() == 0 && slow.pending == 0 && rd.r.partial_len() == 0 {
            return rd.got;
        }
        if !p.step(until, Some(wake)) {
            panic!(
                "stalled: {} SDUs written of {n}, {} read, at {:?}\nsender {:?}\nreceiver {:?}",
                wr.next,
                rd.got.len(),
                p.now,
                p.a.stats(),
                p.b.stats()
            );
        }
    }
}

/// A short Δ (so that a pause of the reader outlasts 2Δ) and a long
/// rendezvous back-off against it.
fn short_delta(rtx: bool) -> EfcpConfig {
    let mut cfg = reliable(true, None, 2, 5);
    cfg.max_pdu_lifetime = ms(200);
    if let Some(d) = cfg.dtcp.as_mut() {
        d.window = Some(WindowFc {
            initial_credit: 8,
            max_closed_queue: 8,
            receiver_buffer: 16,
        });
        d.rtx = rtx.then_some(RtxConfig {
            initial_rto: ms(60),
            min_rto: ms(60),
            max_rto: ms(60),
            max_retries: 16,
            ack_every: 2,
        });
    }
    if !rtx {
        cfg.max_sdu_gap = None;
    }
    cfg
}

#[test]
fn a_reader_pausing_past_the_receivers_inactivity_time_does_not_stall_a_reliable_flow() {
    // Δ = 200 ms + 17 × 60 ms + 5 ms: the receiver ends its run after
    // 2.45 s without a PDU; the sender's rendezvous back off to 64 × RTO
    // (3.84 s) while the reader pauses for 10Δ.
    let cfg = short_delta(true);
    let net = Net {
        delay: ms(5),
        jitter: Duration::ZERO,
        loss: 0.0,
        dup: 0.0,
        ecn: 0.0,
        lossy_until: Instant::ZERO,
    };
    let got = slow_reader_transfer(&cfg, net, 1, (2, 4, 200));
    assert_eq!(got.len(), 300);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// The same with loss of data and control PDUs, with and without
    /// retransmission.
    #[test]
    fn slow_readers_are_never_overrun_and_never_stall(
        seed in any::<u64>(),
        loss in 0.0f64..0.25,
        lossy_for in 0u64..2_000,
        every in 1u64..20,
        burst in 1usize..8,
        pause_at in 0u64..2_000,
        rtx in any::<bool>(),
    ) {
        let net = Net {
            delay: ms(3),
            jitter: ms(2),
            loss,
            dup: 0.05,
            ecn: 0.0,
            lossy_until: at(lossy_for),
        };
        let got = slow_reader_transfer(&short_delta(rtx), net, seed, (every, burst, pause_at));
        let idx: Vec<u64> = got.iter().map(|s| u64::from_be_bytes(s[..8].try_into().unwrap())).collect();
        prop_assert!(idx.windows(2).all(|w| w[0] < w[1]), "order or duplicates: {:?}", idx);
        for (i, s) in idx.iter().zip(&got) {
            prop_assert!(*s == make_sdu(*i, 8 + (*i as usize * 13) % 200), "SDU {} corrupted", i);
        }
        if rtx {
            prop_assert_eq!(idx, (0..300).collect::<Vec<_>>());
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// Flows without retransmission (plain unreliable, in order or not, and
    /// window flow control only): nothing delivered twice, in order where
    /// asked, every SDU that comes out intact, and every SDU written after
    /// loss stopped delivered.
    #[test]
    fn unreliable_flows_never_deliver_twice_and_recover_after_loss(
        seed in any::<u64>(),
        loss in 0.0f64..0.3,
        dup in 0.0f64..0.3,
        jitter in 0u64..6,
        lossy_for in 0u64..400,
        kind in 0u8..3,
        w in widths(),
    ) {
        let (cfg, max_payload) = match kind {
            0 => (EfcpConfig { in_order: false, ..EfcpConfig::unreliable() }, 4096),
            1 => (EfcpConfig { in_order: true, max_reorder: 32, ..EfcpConfig::unreliable() }, 90),
            _ => {
                let mut c = short_delta(false);
                c.max_reorder = 16;
                (c, 90)
            }
        };
        let net = Net {
            delay: ms(6),
            jitter: ms(jitter),
            loss,
            dup,
            ecn: 0.0,
            lossy_until: at(lossy_for),
        };
        let n = 400u64;
        let sdus: Vec<_> = (0..n).map(|i| make_sdu(i, 8 + (i as usize * 29) % 250)).collect();
        let mut p = Pair::new(&cfg, net, seed, w);
        let mut rd = Reader::new();
        let mut written_at = Vec::new();
        let mut got = Vec::new();
        let mut next = 0usize;
        let until = at(20_000);
        loop {
            // One SDU per millisecond, when there is room for all of it.
            if next < n as usize && p.now >= at(next as u64) {
                let mut frags = Vec::new();
                fragment(&sdus[next], MAX_SDU, max_payload, &mut frags).unwrap();
                if p.a.write_capacity() >= frags.len() {
                    for f in frags {
                        p.a.write(p.now, f).unwrap();
                    }
                    written_at.push(p.now);
                    next += 1;
                }
            }
            if cfg.in_order {
                let k = rd.read(&mut p.b, p.now);
                p.b.consumed(p.now, k);
            } else {
                while let Some(d) = p.b.poll_deliver() {
                    rd.seqs.push(d.seq);
                    rd.got.push(d.payload[1..].to_vec());
                }
            }
            let wake = (next < n as usize).then(|| at(next as u64).max(p.now + ms(1)));
            if !p.step(until, wake) {
                break;
            }
        }
        got.extend(rd.got);
        let mut seen = std::collections::BTreeSet::new();
        for s in &rd.seqs {
            prop_assert!(seen.insert(*s), "fragment {} delivered twice", s);
        }
        if cfg.in_order {
            prop_assert!(rd.seqs.windows(2).all(|w| w[0] < w[1]), "out of order");
        }
        let idx: Vec<u64> = got.iter().map(|s| u64::from_be_bytes(s[..8].try_into().unwrap())).collect();
        let mut uniq = std::collections::BTreeSet::new();
        for (i, s) in idx.iter().zip(&got) {
            prop_assert!(uniq.insert(*i), "SDU {} delivered twice", i);
            prop_assert!(*s == sdus[*i as usize], "SDU {} corrupted", i);
        }
        let late: Vec<u64> = (0..next as u64)
            .filter(|&i| written_at[i as usize] >= net.lossy_until)
            .filter(|i| !uniq.contains(i))
            .collect();
        prop_assert!(late.is_empty(), "written after the loss, never delivered: {:?}", late);
    }
}
