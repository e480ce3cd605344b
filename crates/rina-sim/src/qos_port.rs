//! A port-and-link model for QoS experiments: traffic sources (CBR, ON-OFF,
//! Poisson) feed one output port, or ports in tandem (an upper DIF's port
//! whose N-1 flow is a lower DIF's port), each ordered by an unchanged RMT
//! scheduling policy of `rina-core` and drained at its link's rate; the
//! report gives per-class delay and loss figures and every departure from
//! the last port (for rate measurements).
//!
//! Like the rest of the simulator it is deterministic: time is explicit
//! (nanoseconds from zero) and every draw comes from a ChaCha8 stream seeded
//! from the experiment's seed and the source's index. A PDU carries its
//! number in its first 8 bytes; its length is the size the source drew.

use crate::events::EventQueue;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rina_core::rmt::{PortId, QosId, QueueStats, QueuedPdu, Scheduler};
use rina_core::Instant;
use std::collections::BTreeMap;
use std::time::Duration;

/// The N-1 port id every stage uses for its one port.
pub const PORT: PortId = 1;

/// How a source emits PDUs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Pattern {
    /// Constant bit rate (random phase).
    Cbr {
        /// Bit/s.
        rate_bps: u64,
    },
    /// Exponentially distributed ON and OFF periods, CBR while ON (seed
    /// 003's ON-OFF generator).
    OnOff {
        /// Bit/s while ON.
        rate_bps: u64,
        /// Mean ON period.
        mean_on: Duration,
        /// Mean OFF period.
        mean_off: Duration,
    },
    /// Exponential inter-arrival times.
    Poisson {
        /// Average bit/s.
        rate_bps: u64,
    },
}

impl Pattern {
    /// Long-term average rate, bit/s.
    pub fn mean_rate_bps(&self) -> f64 {
        match *self {
            Pattern::Cbr { rate_bps } | Pattern::Poisson { rate_bps } => rate_bps as f64,
            Pattern::OnOff {
                rate_bps,
                mean_on,
                mean_off,
            } => {
                rate_bps as f64 * mean_on.as_secs_f64()
                    / (mean_on.as_secs_f64() + mean_off.as_secs_f64())
            }
        }
    }
}

/// A traffic source.
#[derive(Debug, Clone, PartialEq)]
pub struct Source {
    /// Index of the class its PDUs are counted in.
    pub class: usize,
    /// QoS-id its PDUs carry at the first port.
    pub qos_id: QosId,
    /// Emission pattern.
    pub pattern: Pattern,
    /// PDU size drawn uniformly in this range (bytes, at least 8).
    pub pdu_bytes: (usize, usize),
}

impl Source {
    /// A source of fixed-size PDUs.
    pub fn new(class: usize, qos_id: QosId, pattern: Pattern, pdu_bytes: usize) -> Self {
        Source {
            class,
            qos_id,
            pattern,
            pdu_bytes: (pdu_bytes, pdu_bytes),
        }
    }
}

/// An output port: a scheduling policy drained at `rate_bps`.
#[derive(Debug)]
pub struct Stage {
    /// The policy ordering the port.
    pub sched: Box<dyn Scheduler>,
    /// Link rate, bit/s.
    pub rate_bps: u64,
    /// QoS-id a PDU takes at this port, by its source's QoS-id (the cube
    /// of the lower DIF that carries the upper cube); absent: unchanged.
    pub remap: BTreeMap<QosId, QosId>,
}

impl Stage {
    /// A port with `sched` at `rate_bps`, QoS-ids unchanged.
    pub fn new(sched: Box<dyn Scheduler>, rate_bps: u64) -> Self {
        Stage {
            sched,
            rate_bps,
            remap: BTreeMap::new(),
        }
    }

    /// Carries source QoS-id `from` as `to` at this port.
    pub fn map(mut self, from: QosId, to: QosId) -> Self {
        self.remap.insert(from, to);
        self
    }
}

/// Figures of one class.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClassReport {
    /// Name of the class.
    pub name: String,
    /// PDUs emitted.
    pub offered: u64,
    /// PDUs that left the last port.
    pub delivered: u64,
    /// Bytes that left the last port.
    pub delivered_bytes: u64,
    /// Mean delay from emission to the end of the last transmission.
    pub mean: Duration,
    /// 99th percentile of the delay.
    pub p99: Duration,
    /// Largest delay.
    pub max: Duration,
}

impl ClassReport {
    /// PDUs lost (dropped by a policy).
    pub fn lost(&self) -> u64 {
        self.offered - self.delivered
    }

    /// Fraction of PDUs lost.
    pub fn loss(&self) -> f64 {
        if self.offered == 0 {
            0.0
        } else {
            self.lost() as f64 / self.offered as f64
        }
    }
}

/// One PDU leaving the last port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Departure {
    /// When its transmission ended.
    pub at: Instant,
    /// QoS-id of its source.
    pub qos_id: QosId,
    /// Its size, bytes.
    pub bytes: usize,
}

/// What an experiment measured.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Per class, in class order.
    pub classes: Vec<ClassReport>,
    /// Every departure from the last port, in time order.
    pub departures: Vec<Departure>,
    /// Queue counters of each port at the end.
    pub stats: Vec<Vec<QueueStats>>,
}

impl Report {
    /// The class named `name`.
    pub fn class(&self, name: &str) -> &ClassReport {
        self.classes
            .iter()
            .find(|c| c.name == name)
            .unwrap_or_else(|| panic!("no class {name}"))
    }

    /// Average rate, bit/s, of the PDUs of `qos_ids` that left in `[from, to)`.
    pub fn rate_bps(&self, qos_ids: &[QosId], from: Instant, to: Instant) -> f64 {
        let bits: u64 = self
            .departures
            .iter()
            .filter(|d| d.at >= from && d.at < to && qos_ids.contains(&d.qos_id))
            .map(|d| d.bytes as u64 * 8)
            .sum();
        bits as f64 / (to - from).as_secs_f64()
    }

    /// Largest number of bits of `qos_ids` that left in any window of
    /// length `window` starting at a departure (a sliding window).
    pub fn max_bits_in_window(&self, qos_ids: &[QosId], window: Duration) -> u64 {
        let d: Vec<&Departure> = self
            .departures
            .iter()
            .filter(|d| qos_ids.contains(&d.qos_id))
            .collect();
        let (mut best, mut sum, mut tail) = (0u64, 0u64, 0usize);
        for (head, x) in d.iter().enumerate() {
            sum += x.bytes as u64 * 8;
            while d[tail].at + window <= x.at {
                sum -= d[tail].bytes as u64 * 8;
                tail += 1;
            }
            debug_assert!(tail <= head);
            best = best.max(sum);
        }
        best
    }
}

#[derive(Debug, Clone, Copy)]
enum Ev {
    Emit(usize),
    Free(usize),
    Wake(usize),
}

struct SourceState {
    src: Source,
    rng: ChaCha8Rng,
    on_until: u64,
}

fn exp_ns(rng: &mut ChaCha8Rng, mean: Duration) -> u64 {
    let u: f64 = rng.gen_range(f64::EPSILON..1.0);
    (-u.ln() * mean.as_nanos() as f64) as u64
}

fn tx_ns(bytes: usize, rate_bps: u64) -> u64 {
    ((bytes as u128 * 8 * 1_000_000_000).div_ceil(u128::from(rate_bps.max(1)))) as u64
}

impl SourceState {
    fn size(&mut self) -> usize {
        let (a, b) = self.src.pdu_bytes;
        self.rng.gen_range(a.max(8)..=b.max(a).max(8))
    }

    /// Time of the first emission.
    fn start(&mut self) -> u64 {
        let gap = self.gap();
        match self.src.pattern {
            Pattern::Cbr { .. } => self.rng.gen_range(0..gap.max(1)),
            Pattern::Poisson { .. } => gap,
            Pattern::OnOff {
                mean_on, mean_off, ..
            } => {
                let p_on = mean_on.as_secs_f64() / (mean_on + mean_off).as_secs_f64();
                let mut t = 0;
                if !self.rng.gen_bool(p_on.clamp(0.0, 1.0)) {
                    t = exp_ns(&mut self.rng, mean_off);
                }
                self.on_until = t + exp_ns(&mut self.rng, mean_on).max(1);
                t + self.rng.gen_range(0..gap.max(1))
            }
        }
    }

    /// Mean gap between PDUs at the pattern's rate (mean size).
    fn gap(&self) -> u64 {
        let (a, b) = self.src.pdu_bytes;
        let rate = match self.src.pattern {
            Pattern::Cbr { rate_bps }
            | Pattern::Poisson { rate_bps }
            | Pattern::OnOff { rate_bps, .. } => rate_bps,
        };
        tx_ns((a + b.max(a)) / 2, rate)
    }

    /// Time of the emission after one at `t`.
    fn next(&mut self, t: u64) -> u64 {
        let gap = self.gap();
        match self.src.pattern {
            Pattern::Cbr { .. } => t + gap,
            Pattern::Poisson { .. } => t + exp_ns(&mut self.rng, Duration::from_nanos(gap)).max(1),
            Pattern::OnOff {
                mean_on, mean_off, ..
            } => {
                let mut n = t + gap;
                // Every ON period lasts at least 1 ns, so this ends (a
                // zero mean ON period is refused by `run`).
                while n >= self.on_until {
                    let start = self.on_until + exp_ns(&mut self.rng, mean_off);
                    self.on_until = start + exp_ns(&mut self.rng, mean_on).max(1);
                    n = start;
                }
                n
            }
        }
    }
}

struct Packet {
    class: usize,
    qos_id: QosId,
    created: u64,
}

struct StageState {
    stage: Stage,
    busy: Option<QueuedPdu>,
    wake: Option<u64>,
}

/// An experiment: sources feeding ports in tandem.
pub struct QosExperiment {
    classes: Vec<String>,
    sources: Vec<Source>,
    stages: Vec<Stage>,
    seed: u64,
}

/// Largest number of events one run may take.
pub const MAX_EVENTS: u64 = 50_000_000;

/// Why a QoS experiment cannot run, or gave up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QosError {
    /// The experiment has no port.
    NoPort,
    /// A source counts its PDUs in a class the experiment does not name.
    UnknownClass {
        /// The source (index, in the order added).
        source: usize,
        /// Its class index.
        class: usize,
        /// How many classes the experiment names.
        classes: usize,
    },
    /// An ON-OFF source's mean ON period is zero: it would never be ON
    /// (its next ON period was looked for forever; with a zero OFF period
    /// too, its chance of starting ON was 0/0 and the draw panicked).
    ZeroMeanOn {
        /// The source (index, in the order added).
        source: usize,
    },
    /// The run took [`MAX_EVENTS`] events without finishing.
    RunAway {
        /// Events processed.
        events: u64,
        /// Virtual time reached.
        at: Duration,
    },
}

impl std::fmt::Display for QosError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            QosError::NoPort => write!(f, "an experiment needs a port"),
            QosError::UnknownClass {
                source,
                class,
                classes,
            } => write!(
                f,
                "source {source}: class {class} is not named (the experiment names {classes}: \
                 0..{classes})"
            ),
            QosError::ZeroMeanOn { source } => write!(
                f,
                "source {source}: an ON-OFF source's `mean_on` must be above zero (it would \
                 never be ON)"
            ),
            QosError::RunAway { events, at } => write!(
                f,
                "the experiment runs away: {events} events by {at:?} of virtual time"
            ),
        }
    }
}

impl std::error::Error for QosError {}

impl QosExperiment {
    /// An experiment with the named classes and draws seeded by `seed`.
    pub fn new(seed: u64, classes: &[&str]) -> Self {
        QosExperiment {
            classes: classes.iter().map(|c| c.to_string()).collect(),
            sources: Vec::new(),
            stages: Vec::new(),
            seed,
        }
    }

    /// Adds a source (checked when the experiment runs).
    pub fn source(mut self, s: Source) -> Self {
        self.sources.push(s);
        self
    }

    /// Adds a port after the last one.
    pub fn stage(mut self, s: Stage) -> Self {
        self.stages.push(s);
        self
    }

    /// Long-term average rate of all sources, bit/s.
    pub fn offered_bps(&self) -> f64 {
        self.sources.iter().map(|s| s.pattern.mean_rate_bps()).sum()
    }

    /// Checks that the experiment can run: a port, and sources of named
    /// classes whose ON periods (if any) are not all empty.
    fn check(&self) -> Result<(), QosError> {
        if self.stages.is_empty() {
            return Err(QosError::NoPort);
        }
        for (source, s) in self.sources.iter().enumerate() {
            if s.class >= self.classes.len() {
                return Err(QosError::UnknownClass {
                    source,
                    class: s.class,
                    classes: self.classes.len(),
                });
            }
            if let Pattern::OnOff { mean_on, .. } = s.pattern {
                if mean_on.is_zero() {
                    return Err(QosError::ZeroMeanOn { source });
                }
            }
        }
        Ok(())
    }

    /// Runs: sources emit during `duration`, then the ports drain. Fails
    /// if the experiment cannot run ([`QosError`]) or takes more than
    /// [`MAX_EVENTS`] events.
    pub fn run(self, duration: Duration) -> Result<Report, QosError> {
        self.check()?;
        let QosExperiment {
            classes,
            sources,
            stages,
            seed,
        } = self;
        let end = u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX);
        let mut ev: EventQueue<Ev> = EventQueue::new();
        let mut srcs: Vec<SourceState> = sources
            .into_iter()
            .enumerate()
            .map(|(i, src)| SourceState {
                src,
                rng: ChaCha8Rng::seed_from_u64(
                    seed ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15),
                ),
                on_until: u64::MAX,
            })
            .collect();
        for (i, s) in srcs.iter_mut().enumerate() {
            let t = s.start();
            if t < end {
                ev.push(Instant::from_nanos(t), Ev::Emit(i));
            }
        }
        let mut st: Vec<StageState> = stages
            .into_iter()
            .map(|mut stage| {
                stage.sched.create_queues(PORT);
                StageState {
                    stage,
                    busy: None,
                    wake: None,
                }
            })
            .collect();
        let last = st.len() - 1;
        let mut packets: Vec<Packet> = Vec::new();
        let mut delays: Vec<Vec<u64>> = vec![Vec::new(); classes.len()];
        let mut report = Report {
            classes: classes
                .iter()
                .map(|n| ClassReport {
                    name: n.clone(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        let mut steps = 0u64;
        while let Some((now, e)) = ev.pop() {
            steps += 1;
            if steps >= MAX_EVENTS {
                return Err(QosError::RunAway {
                    events: steps,
                    at: Duration::from_nanos(now.as_nanos()),
                });
            }
            let t = now.as_nanos();
            match e {
                Ev::Emit(i) => {
                    let s = &mut srcs[i];
                    let size = s.size();
                    let id = packets.len() as u64;
                    packets.push(Packet {
                        class: s.src.class,
                        qos_id: s.src.qos_id,
                        created: t,
                    });
                    report.classes[s.src.class].offered += 1;
                    let mut bytes = vec![0u8; size];
                    bytes[..8].copy_from_slice(&id.to_le_bytes());
                    let qos_id = s.src.qos_id;
                    let n = s.next(t);
                    if n < end {
                        ev.push(Instant::from_nanos(n), Ev::Emit(i));
                    }
                    offer(&mut st[0], now, qos_id, bytes);
                    try_send(&mut st, 0, now, &mut ev);
                }
                Ev::Free(k) => {
                    let Some(pdu) = st[k].busy.take() else {
                        continue;
                    };
                    let id = u64::from_le_bytes(pdu.bytes[..8].try_into().unwrap_or_default());
                    let p = &packets[id as usize];
                    if k == last {
                        let c = &mut report.classes[p.class];
                        c.delivered += 1;
                        c.delivered_bytes += pdu.bytes.len() as u64;
                        delays[p.class].push(t - p.created);
                        report.departures.push(Departure {
                            at: now,
                            qos_id: p.qos_id,
                            bytes: pdu.bytes.len(),
                        });
                    } else {
                        let q = p.qos_id;
                        offer(&mut st[k + 1], now, q, pdu.bytes.into_vec());
                        try_send(&mut st, k + 1, now, &mut ev);
                    }
                    try_send(&mut st, k, now, &mut ev);
                }
                Ev::Wake(k) => {
                    if st[k].wake == Some(t) {
                        st[k].wake = None;
                        try_send(&mut st, k, now, &mut ev);
                    }
                }
            }
        }
        for (c, d) in report.classes.iter_mut().zip(delays.iter_mut()) {
            if d.is_empty() {
                continue;
            }
            d.sort_unstable();
            c.mean = Duration::from_nanos(d.iter().sum::<u64>() / d.len() as u64);
            c.p99 = Duration::from_nanos(d[(d.len() * 99 / 100).min(d.len() - 1)]);
            c.max = Duration::from_nanos(d[d.len() - 1]);
        }
        report.stats = st.iter().map(|s| s.stage.sched.stats(PORT)).collect();
        Ok(report)
    }
}

/// Queues a PDU of source QoS-id `qos_id` at a port (a drop is counted by
/// the policy and shows as a loss).
fn offer(s: &mut StageState, now: Instant, qos_id: QosId, bytes: Vec<u8>) {
    let pdu = QueuedPdu {
        qos_id: s.stage.remap.get(&qos_id).copied().unwrap_or(qos_id),
        mgmt: false,
        bytes: bytes.into(),
    };
    let _ = s.stage.sched.enqueue(now, PORT, pdu);
}

/// Starts the next transmission of port `k` if it is idle.
fn try_send(st: &mut [StageState], k: usize, now: Instant, ev: &mut EventQueue<Ev>) {
    let s = &mut st[k];
    if s.busy.is_some() {
        return;
    }
    match s.stage.sched.next_to_send(now, PORT) {
        Some(pdu) => {
            let done = now + Duration::from_nanos(tx_ns(pdu.bytes.len(), s.stage.rate_bps));
            s.busy = Some(pdu);
            ev.push(done, Ev::Free(k));
        }
        None if s.stage.sched.has_queued(PORT) => {
            if let Some(w) = s.stage.sched.next_wakeup(PORT) {
                // Never in the past: at least one nanosecond on.
                let w = w.max(now + Duration::from_nanos(1)).as_nanos();
                if !matches!(s.wake, Some(p) if p <= w && p > now.as_nanos()) {
                    s.wake = Some(w);
                    ev.push(Instant::from_nanos(w), Ev::Wake(k));
                }
            }
        }
        None => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rina_core::rmt::Fifo;

    fn on_off(mean_on: Duration, mean_off: Duration) -> Source {
        let pattern = Pattern::OnOff {
            rate_bps: 1_000_000,
            mean_on,
            mean_off,
        };
        Source::new(0, 1, pattern, 100)
    }

    fn run(sources: &[Source]) -> Result<Report, QosError> {
        let mut e = QosExperiment::new(1, &["a"]);
        for s in sources {
            e = e.source(s.clone());
        }
        e.stage(Stage::new(Box::new(Fifo::new(10)), 1_000_000))
            .run(Duration::from_millis(10))
    }

    #[test]
    fn an_on_off_source_never_on_is_refused_not_a_panic_or_a_hang() {
        // mean_on = mean_off = 0: the chance of starting ON was 0/0 and
        // gen_bool panicked; mean_on = 0, mean_off = 1 ms: the next ON
        // period was looked for forever.
        let ms = Duration::from_millis(1);
        let cbr = Source::new(0, 1, Pattern::Cbr { rate_bps: 1000 }, 100);
        for off in [Duration::ZERO, ms] {
            let e = run(&[cbr.clone(), on_off(Duration::ZERO, off)]).unwrap_err();
            assert_eq!(e, QosError::ZeroMeanOn { source: 1 });
            assert!(
                e.to_string().contains("`mean_on` must be above zero"),
                "{e}"
            );
        }
        // The shortest ON periods (each lasts at least 1 ns, so the next
        // is found): a PDU at the start of each, about one per OFF period.
        let r = run(&[on_off(Duration::from_nanos(1), ms)]).unwrap();
        let offered = r.class("a").offered;
        assert!((4..=20).contains(&offered), "{offered}");
        // ON and OFF of 1 ms, 1 Mbit/s of 100-byte PDUs while ON: 800 µs
        // apart, about 6 in 10 ms.
        let offered = run(&[on_off(ms, ms)]).unwrap().class("a").offered;
        assert!((2..=12).contains(&offered), "{offered}");
    }

    #[test]
    fn no_port_or_an_unnamed_class_is_an_error() {
        let e = QosExperiment::new(1, &["a"]).run(Duration::from_millis(1));
        assert_eq!(e.unwrap_err(), QosError::NoPort);
        let s = Source::new(2, 1, Pattern::Cbr { rate_bps: 1000 }, 100);
        assert_eq!(
            run(&[s]).unwrap_err(),
            QosError::UnknownClass {
                source: 0,
                class: 2,
                classes: 1
            }
        );
    }
}
