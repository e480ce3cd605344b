//! Per-flow measurement as a pure accumulator: [`FlowMetrics`] is fed the
//! receive time and the decoded header of every DATA SDU (and, when the
//! sender's FIN arrives, what was sent), and summarises it as a
//! [`FlowReport`]. Times are ns on the sender's clock scale (Unix epoch on
//! real hosts, virtual time in the simulator).

use super::header::Header;
use serde::{Deserialize, Serialize};

/// Width of the fine histogram bins below [`HIST_FINE_LIMIT_US`], µs.
pub const HIST_FINE_US: u64 = 10;
/// Upper edge of the fine bins, µs (100 ms).
pub const HIST_FINE_LIMIT_US: u64 = 100_000;
/// Width of the coarse bins from 100 ms to [`HIST_LIMIT_US`], µs.
pub const HIST_COARSE_US: u64 = 1_000;
/// Upper edge of the histogram (10 s); larger delays go to the last bin.
pub const HIST_LIMIT_US: u64 = 10_000_000;

const FINE_BINS: usize = (HIST_FINE_LIMIT_US / HIST_FINE_US) as usize;
const BINS: usize =
    FINE_BINS + ((HIST_LIMIT_US - HIST_FINE_LIMIT_US) / HIST_COARSE_US) as usize + 1;

/// The histogram bin of a delay in ns (negative delays, from clock offsets,
/// go to bin 0).
fn bin_of(delay_ns: i64) -> usize {
    let us = (delay_ns.max(0) / 1000) as u64;
    if us < HIST_FINE_LIMIT_US {
        (us / HIST_FINE_US) as usize
    } else if us < HIST_LIMIT_US {
        FINE_BINS + ((us - HIST_FINE_LIMIT_US) / HIST_COARSE_US) as usize
    } else {
        BINS - 1
    }
}

/// The lower edge of bin `i`, µs.
pub fn bin_lower_us(i: usize) -> u64 {
    if i < FINE_BINS {
        i as u64 * HIST_FINE_US
    } else {
        HIST_FINE_LIMIT_US + (i - FINE_BINS) as u64 * HIST_COARSE_US
    }
}

fn bin_width_us(i: usize) -> u64 {
    if i < FINE_BINS {
        HIST_FINE_US
    } else {
        HIST_COARSE_US
    }
}

/// The one-way delay of an SDU sent at `send_ns` and received at
/// `recv_ns`, negative if the sender's clock is ahead; the times are the
/// peer's word, so the difference is taken without overflow (a send time
/// of 2^63 ns made it wrap, or panic in a debug build) and saturates at
/// ±2^63 ns (292 years).
fn delay_ns(recv_ns: u64, send_ns: u64) -> i64 {
    let d = i128::from(recv_ns) - i128::from(send_ns);
    i64::try_from(d).unwrap_or(if d < 0 { i64::MIN } else { i64::MAX })
}

/// How many sequence numbers, up to the highest seen, duplicate detection
/// remembers (8 KiB of bits per flow and direction, whatever the numbers).
/// An SDU further behind the highest than this is counted as received and
/// reordered, and in `late_unchecked`: whether it is a duplicate is not
/// known.
pub const DUP_WINDOW: u64 = 1 << 16;

const WINDOW_WORDS: usize = (DUP_WINDOW / 64) as usize;

/// What [`SeqWindow::check`] found of a sequence number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    /// Not seen before: the highest yet, or a gap in the window filled.
    New,
    /// Seen before, within the window.
    Duplicate,
    /// Older than the window: not known.
    TooOld,
}

/// The sequence numbers seen among the [`DUP_WINDOW`] up to the highest,
/// as a ring of bits (bit `seq % DUP_WINDOW`), allocated at the first SDU.
/// Its size does not depend on the numbers, which are the peer's word.
#[derive(Debug, Clone, Default)]
struct SeqWindow {
    bits: Vec<u64>,
    highest: Option<u64>,
}

impl SeqWindow {
    /// Records `seq`, moving the window up if it is the highest yet.
    fn check(&mut self, seq: u64) -> Seen {
        if self.bits.is_empty() {
            self.bits = vec![0; WINDOW_WORDS];
        }
        match self.highest {
            Some(h) if seq <= h => {
                if h - seq >= DUP_WINDOW {
                    return Seen::TooOld;
                }
                let (w, bit) = Self::slot(seq);
                if self.bits[w] & bit != 0 {
                    return Seen::Duplicate;
                }
                self.bits[w] |= bit;
            }
            prev => {
                if let Some(h) = prev {
                    self.forget_after(h, seq);
                }
                self.highest = Some(seq);
                let (w, bit) = Self::slot(seq);
                self.bits[w] |= bit;
            }
        }
        Seen::New
    }

    /// Clears the bits of `h + 1 ..= seq` (`h < seq`), which now stand for
    /// those numbers instead of ones that left the window; a word at a time.
    fn forget_after(&mut self, h: u64, seq: u64) {
        let mut left = seq - h;
        if left >= DUP_WINDOW {
            self.bits.fill(0);
            return;
        }
        let mut s = h + 1;
        while left > 0 {
            let pos = s % DUP_WINDOW;
            let (w, first) = ((pos / 64) as usize, pos % 64);
            let take = (64 - first).min(left);
            let mask = if take == 64 {
                u64::MAX
            } else {
                ((1u64 << take) - 1) << first
            };
            self.bits[w] &= !mask;
            left -= take;
            s = s.wrapping_add(take);
        }
    }

    fn slot(seq: u64) -> (usize, u64) {
        let pos = seq % DUP_WINDOW;
        ((pos / 64) as usize, 1u64 << (pos % 64))
    }
}

/// The accumulator of one direction of one flow.
#[derive(Debug, Clone)]
pub struct FlowMetrics {
    flow: u32,
    recv_sdus: u64,
    recv_bytes: u64,
    duplicates: u64,
    reordered: u64,
    late_unchecked: u64,
    max_seq: Option<u64>,
    seen: SeqWindow,
    sent: Option<(u64, u64)>,
    first_recv_ns: Option<u64>,
    last_recv_ns: u64,
    bytes_after_first: u64,
    delay_min: i64,
    delay_max: i64,
    delay_sum: i128,
    delays: u64,
    /// RFC 3550 interarrival jitter, ns (as f64).
    jitter: f64,
    last_transit: Option<i64>,
    hist: Vec<u64>,
    samples: Option<Vec<i64>>,
    sample_cap: usize,
    samples_dropped: u64,
}

impl FlowMetrics {
    /// An empty accumulator for `flow`; keeps up to `sample_cap` raw delay
    /// samples (0: none, the histogram only).
    pub fn new(flow: u32, sample_cap: usize) -> FlowMetrics {
        FlowMetrics {
            flow,
            recv_sdus: 0,
            recv_bytes: 0,
            duplicates: 0,
            reordered: 0,
            late_unchecked: 0,
            max_seq: None,
            seen: SeqWindow::default(),
            sent: None,
            first_recv_ns: None,
            last_recv_ns: 0,
            bytes_after_first: 0,
            delay_min: i64::MAX,
            delay_max: i64::MIN,
            delay_sum: 0,
            delays: 0,
            jitter: 0.0,
            last_transit: None,
            hist: vec![0; BINS],
            samples: (sample_cap > 0).then(Vec::new),
            sample_cap,
            samples_dropped: 0,
        }
    }

    /// The flow id.
    pub fn flow(&self) -> u32 {
        self.flow
    }

    /// Distinct SDUs received so far.
    pub fn recv_sdus(&self) -> u64 {
        self.recv_sdus
    }

    /// Bytes of those SDUs.
    pub fn recv_bytes(&self) -> u64 {
        self.recv_bytes
    }

    /// One SDU of `len` bytes with header `h` received at `recv_ns`.
    /// Returns false if it was a duplicate (counted, not measured).
    pub fn on_sdu(&mut self, recv_ns: u64, h: &Header, len: usize) -> bool {
        let seq = h.seq;
        match self.seen.check(seq) {
            Seen::New => {}
            Seen::Duplicate => {
                self.duplicates += 1;
                return false;
            }
            Seen::TooOld => self.late_unchecked += 1,
        }
        match self.max_seq {
            Some(m) if seq < m => self.reordered += 1,
            _ => self.max_seq = Some(seq),
        }
        self.recv_sdus += 1;
        self.recv_bytes += len as u64;
        match self.first_recv_ns {
            None => self.first_recv_ns = Some(recv_ns),
            Some(_) => self.bytes_after_first += len as u64,
        }
        self.last_recv_ns = self.last_recv_ns.max(recv_ns);
        let d = delay_ns(recv_ns, h.send_ns);
        self.delay_min = self.delay_min.min(d);
        self.delay_max = self.delay_max.max(d);
        self.delay_sum += d as i128;
        self.delays += 1;
        // RFC 3550 §6.4.1: D = (Rj - Sj) - (Ri - Si); J += (|D| - J) / 16.
        if let Some(prev) = self.last_transit {
            let dd = (i128::from(d) - i128::from(prev)).unsigned_abs() as f64;
            self.jitter += (dd - self.jitter) / 16.0;
        }
        self.last_transit = Some(d);
        self.hist[bin_of(d)] += 1;
        if let Some(s) = self.samples.as_mut() {
            if s.len() < self.sample_cap {
                s.push(d);
            } else {
                self.samples_dropped += 1;
            }
        }
        true
    }

    /// Bytes this accumulator holds on the heap: the histogram, the
    /// duplicate window and the raw samples. Bounded by the sample cap,
    /// whatever the peer's sequence numbers.
    pub fn heap_bytes(&self) -> usize {
        let words = self.hist.capacity() + self.seen.bits.capacity();
        words * 8 + self.samples.as_ref().map_or(0, |s| s.capacity() * 8)
    }

    /// The sender's totals (from its FIN).
    pub fn on_fin(&mut self, sent_sdus: u64, sent_bytes: u64) {
        self.sent = Some((sent_sdus, sent_bytes));
    }

    /// SDUs the sender wrote: from its FIN, else highest sequence number + 1.
    pub fn sent_sdus(&self) -> u64 {
        match self.sent {
            Some((n, _)) => n,
            None => self.max_seq.map_or(0, |m| m.saturating_add(1)),
        }
    }

    /// The summary so far. `with_hist` includes the sparse histogram,
    /// `with_samples` the raw delays (µs).
    pub fn report(&self, direction: &str, with_hist: bool, with_samples: bool) -> FlowReport {
        let sent_sdus = self.sent_sdus();
        let lost = sent_sdus.saturating_sub(self.recv_sdus);
        let loss_pct = if sent_sdus == 0 {
            0.0
        } else {
            lost as f64 * 100.0 / sent_sdus as f64
        };
        let span_ns = self
            .first_recv_ns
            .map_or(0, |f| self.last_recv_ns.saturating_sub(f));
        let goodput_bps = if span_ns == 0 {
            0.0
        } else {
            self.bytes_after_first as f64 * 8.0 / (span_ns as f64 / 1e9)
        };
        let delay = (self.delays > 0).then(|| {
            let us = |ns: f64| ns / 1e3;
            let pct = |p: f64| us(self.percentile_ns(p));
            DelayStats {
                min_us: us(self.delay_min as f64),
                avg_us: us(self.delay_sum as f64 / self.delays as f64),
                max_us: us(self.delay_max as f64),
                p50_us: pct(50.0),
                p90_us: pct(90.0),
                p99_us: pct(99.0),
                p999_us: pct(99.9),
                jitter_us: us(self.jitter),
            }
        });
        FlowReport {
            flow: self.flow,
            direction: direction.to_string(),
            sent_sdus,
            sent_bytes: self.sent.map(|(_, b)| b),
            recv_sdus: self.recv_sdus,
            recv_bytes: self.recv_bytes,
            lost_sdus: lost,
            loss_pct,
            duplicates: self.duplicates,
            reordered: self.reordered,
            late_unchecked: self.late_unchecked,
            fin_received: self.sent.is_some(),
            first_recv_ns: self.first_recv_ns,
            last_recv_ns: self.first_recv_ns.map(|_| self.last_recv_ns),
            goodput_bps,
            delay,
            histogram: with_hist.then(|| self.sparse_hist()),
            samples_us: if with_samples {
                self.samples
                    .as_ref()
                    .map(|s| s.iter().map(|&d| d as f64 / 1e3).collect())
            } else {
                None
            },
            samples_dropped: self.samples_dropped,
        }
    }

    /// Sparse histogram: `[lower_edge_us, width_us, count]` of non-empty bins.
    pub fn sparse_hist(&self) -> Vec<[u64; 3]> {
        self.hist
            .iter()
            .enumerate()
            .filter(|(_, &c)| c > 0)
            .map(|(i, &c)| [bin_lower_us(i), bin_width_us(i), c])
            .collect()
    }

    /// The `p`-th percentile delay in ns: exact from the raw samples when all
    /// were kept, else from the histogram (bin midpoint, clamped to min/max).
    fn percentile_ns(&self, p: f64) -> f64 {
        if let Some(s) = self.samples.as_ref().filter(|_| self.samples_dropped == 0) {
            let mut v: Vec<f64> = s.iter().map(|&d| d as f64).collect();
            v.sort_by(f64::total_cmp);
            return crate::stats::percentile(&v, p);
        }
        let rank = ((p / 100.0) * self.delays as f64).ceil().max(1.0) as u64;
        let mut acc = 0;
        for (i, &c) in self.hist.iter().enumerate() {
            acc += c;
            if acc >= rank {
                let mid = (bin_lower_us(i) as f64 + bin_width_us(i) as f64 / 2.0) * 1e3;
                return mid.clamp(self.delay_min as f64, self.delay_max as f64);
            }
        }
        self.delay_max as f64
    }
}

/// One-way delay statistics, µs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct DelayStats {
    /// Smallest.
    pub min_us: f64,
    /// Mean.
    pub avg_us: f64,
    /// Largest.
    pub max_us: f64,
    /// Median.
    pub p50_us: f64,
    /// 90th percentile.
    pub p90_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// 99.9th percentile.
    pub p999_us: f64,
    /// RFC 3550 interarrival jitter.
    pub jitter_us: f64,
}

/// The summary of one direction of one flow (schema in docs/rina-tgen.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FlowReport {
    /// Flow id.
    pub flow: u32,
    /// `fwd` (client to server, measured by the server), `rev` (server to
    /// client, measured by the client) or `rtt` (probes; delay = RTT / 2).
    pub direction: String,
    /// SDUs the sender wrote (its FIN; else highest seq + 1).
    pub sent_sdus: u64,
    /// Bytes the sender wrote (only known from its FIN).
    pub sent_bytes: Option<u64>,
    /// Distinct SDUs received.
    pub recv_sdus: u64,
    /// Their bytes, header included.
    pub recv_bytes: u64,
    /// `sent_sdus - recv_sdus`.
    pub lost_sdus: u64,
    /// Lost, in % of sent.
    pub loss_pct: f64,
    /// SDUs whose sequence number had been received before.
    pub duplicates: u64,
    /// SDUs that arrived after one with a higher sequence number.
    pub reordered: u64,
    /// Of those, SDUs that arrived more than [`DUP_WINDOW`] sequence
    /// numbers behind the highest: counted as received, but not checked
    /// for duplication.
    #[serde(default)]
    pub late_unchecked: u64,
    /// Whether the sender's FIN arrived (else `sent_sdus` is an estimate).
    pub fin_received: bool,
    /// First receive time, ns.
    pub first_recv_ns: Option<u64>,
    /// Last receive time, ns.
    pub last_recv_ns: Option<u64>,
    /// Bytes after the first SDU over first..last receive time, bit/s.
    pub goodput_bps: f64,
    /// Delay statistics, if anything arrived.
    pub delay: Option<DelayStats>,
    /// `[lower_edge_us, width_us, count]` of every non-empty bin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub histogram: Option<Vec<[u64; 3]>>,
    /// Raw delays in µs, in order of arrival (with `--samples`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub samples_us: Option<Vec<f64>>,
    /// Samples not kept (beyond the cap).
    #[serde(default)]
    pub samples_dropped: u64,
}

impl FlowReport {
    /// The CSV header of [`FlowReport::csv_row`].
    pub const CSV_HEADER: &'static str = "flow,direction,peer,profile,sent_sdus,sent_bytes,recv_sdus,recv_bytes,lost_sdus,loss_pct,duplicates,reordered,goodput_bps,delay_min_us,delay_avg_us,delay_max_us,delay_p50_us,delay_p90_us,delay_p99_us,delay_p999_us,jitter_us";

    /// One CSV row; `peer` and `profile` describe the flow.
    pub fn csv_row(&self, peer: &str, profile: &str) -> String {
        let f = |x: Option<f64>| x.map_or(String::new(), |v| format!("{v:.3}"));
        let d = self.delay;
        format!(
            "{},{},{},{},{},{},{},{},{},{:.4},{},{},{:.0},{},{},{},{},{},{},{},{}",
            self.flow,
            self.direction,
            peer,
            profile,
            self.sent_sdus,
            self.sent_bytes.map_or(String::new(), |b| b.to_string()),
            self.recv_sdus,
            self.recv_bytes,
            self.lost_sdus,
            self.loss_pct,
            self.duplicates,
            self.reordered,
            self.goodput_bps,
            f(d.map(|d| d.min_us)),
            f(d.map(|d| d.avg_us)),
            f(d.map(|d| d.max_us)),
            f(d.map(|d| d.p50_us)),
            f(d.map(|d| d.p90_us)),
            f(d.map(|d| d.p99_us)),
            f(d.map(|d| d.p999_us)),
            f(d.map(|d| d.jitter_us)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(seq: u64, send_ns: u64) -> Header {
        Header::data(1, seq, send_ns)
    }

    #[test]
    fn counts_loss_duplicates_reordering_and_delay() {
        let mut m = FlowMetrics::new(1, 100);
        // seq 0..10 sent 1 ms apart, delay 5 ms; 3 lost, 5 duplicated, 7 before 6.
        for seq in [0, 1, 2, 4, 5, 7, 6, 8, 9, 5] {
            let send = seq * 1_000_000;
            m.on_sdu(send + 5_000_000, &h(seq, send), 100);
        }
        m.on_fin(10, 1000);
        let r = m.report("fwd", true, true);
        assert_eq!(r.recv_sdus, 9);
        assert_eq!(r.duplicates, 1);
        assert_eq!(r.reordered, 1);
        assert_eq!(r.lost_sdus, 1);
        assert!((r.loss_pct - 10.0).abs() < 1e-9);
        let d = r.delay.unwrap();
        assert_eq!(
            (d.min_us, d.max_us, d.avg_us, d.p50_us),
            (5000.0, 5000.0, 5000.0, 5000.0)
        );
        assert_eq!(d.jitter_us, 0.0);
        assert_eq!(r.histogram.unwrap(), vec![[5000, 10, 9]]);
        assert_eq!(r.samples_us.unwrap().len(), 9);
        // 8 SDUs of 100 bytes after the first, over 9 ms.
        assert!((r.goodput_bps - 800.0 * 8.0 / 0.009).abs() < 1e-6);
    }

    #[test]
    fn jitter_follows_rfc3550() {
        let mut m = FlowMetrics::new(1, 0);
        // Transit alternates 1 ms / 2 ms: |D| = 1 ms each time.
        for seq in 0..1000u64 {
            let send = seq * 10_000_000;
            let delay = if seq % 2 == 0 { 1_000_000 } else { 2_000_000 };
            m.on_sdu(send + delay, &h(seq, send), 64);
        }
        let d = m.report("fwd", false, false).delay.unwrap();
        assert!((d.jitter_us - 1000.0).abs() < 1.0, "{}", d.jitter_us);
        // Histogram percentiles (no samples): within a bin of the truth.
        assert!((d.p50_us - 1000.0).abs() <= 10.0, "{}", d.p50_us);
        assert!((d.p99_us - 2000.0).abs() <= 10.0, "{}", d.p99_us);
    }

    #[test]
    fn bins_cover_the_range() {
        assert_eq!(bin_of(-5), 0);
        assert_eq!(bin_of(9_999), 0);
        assert_eq!(bin_of(10_000), 1);
        assert_eq!(bin_lower_us(bin_of(150_000_000)), 150_000);
        assert_eq!(bin_of(100_000_000_000), BINS - 1);
    }

    #[test]
    fn a_peers_extreme_times_and_sequence_numbers_do_not_overflow() {
        let mut m = FlowMetrics::new(1, 10);
        let now = 1_700_000_000_000_000_000;
        // A send time in 2262: a delay of -238 years, not a wrapped one;
        // beyond ±292 years, saturated.
        assert!(m.on_sdu(now, &h(0, 1 << 63), 100));
        assert!(m.on_sdu(now, &h(1, u64::MAX), 100));
        assert!(m.on_sdu(u64::MAX, &h(2, 0), 100));
        assert!(m.on_sdu(now, &h(u64::MAX, now - 5_000), 100));
        let r = m.report("fwd", true, true);
        let d = r.delay.unwrap();
        assert_eq!(d.min_us, i64::MIN as f64 / 1e3);
        assert_eq!(d.max_us, i64::MAX as f64 / 1e3);
        assert!(d.jitter_us > 0.0 && d.jitter_us.is_finite(), "{d:?}");
        // seq = u64::MAX: highest + 1 saturates.
        assert_eq!(r.sent_sdus, u64::MAX);
        assert_eq!(r.recv_sdus, 4);
        assert_eq!(delay_ns(now, 1 << 63), -7_523_372_036_854_775_808);
        assert_eq!(delay_ns(0, u64::MAX), i64::MIN);
        assert_eq!(delay_ns(u64::MAX, 0), i64::MAX);
        assert_eq!(delay_ns(10, 3), 7);
    }

    #[test]
    fn duplicate_detection_memory_does_not_follow_the_peers_sequence_numbers() {
        let mut small = FlowMetrics::new(1, 0);
        small.on_sdu(10, &h(0, 0), 28);
        let bound = small.heap_bytes();
        // Before, the bitmap grew to seq / 8 bytes: 8 MiB for 2^26 - 1.
        let mut m = FlowMetrics::new(1, 0);
        for seq in [(1 << 26) - 1, 1 << 40, u64::MAX - 1] {
            assert!(m.on_sdu(10, &h(seq, 0), 28));
            assert_eq!(m.heap_bytes(), bound, "after seq {seq}");
        }
        assert!(bound < 200 * 1024, "{bound}");
    }

    #[test]
    fn duplicates_are_found_near_any_sequence_number() {
        let mut m = FlowMetrics::new(1, 0);
        let base = 1u64 << 40;
        // Before, numbers from 2^26 up were never checked: all 4 counted.
        for seq in [base, base + 1, base, base + 1] {
            m.on_sdu(10, &h(seq, 0), 28);
        }
        // A gap filled late is new once, then a duplicate; at the top of
        // the numbers too.
        for seq in [
            base + 5,
            base + 3,
            base + 3,
            u64::MAX,
            u64::MAX - 2,
            u64::MAX,
        ] {
            m.on_sdu(10, &h(seq, 0), 28);
        }
        let r = m.report("fwd", false, false);
        assert_eq!((r.recv_sdus, r.duplicates), (6, 4));
        assert_eq!((r.reordered, r.late_unchecked), (2, 0));
    }

    #[test]
    fn the_window_slides_and_older_sdus_are_counted_unchecked() {
        let mut m = FlowMetrics::new(1, 0);
        for seq in 0..3 * DUP_WINDOW {
            assert!(m.on_sdu(10, &h(seq, 0), 28));
        }
        let top = 3 * DUP_WINDOW - 1;
        // Inside the window: still known as duplicates.
        assert!(!m.on_sdu(10, &h(top, 0), 28));
        assert!(!m.on_sdu(10, &h(top + 1 - DUP_WINDOW, 0), 28));
        // Just outside: received (late), not known to be a duplicate.
        assert!(m.on_sdu(10, &h(top - DUP_WINDOW, 0), 28));
        assert!(m.on_sdu(10, &h(0, 0), 28));
        // A jump of less than the window forgets exactly what it passes:
        // the numbers it skipped are new, the ones it kept are not.
        let jump = top + DUP_WINDOW / 2 + 3;
        assert!(m.on_sdu(10, &h(jump, 0), 28));
        assert!(m.on_sdu(10, &h(jump - 1, 0), 28));
        assert!(!m.on_sdu(10, &h(top, 0), 28));
        assert!(!m.on_sdu(10, &h(jump + 1 - DUP_WINDOW, 0), 28));
        let r = m.report("fwd", false, false);
        assert_eq!(r.late_unchecked, 2);
        assert_eq!(r.duplicates, 4);
        assert_eq!(r.recv_sdus, 3 * DUP_WINDOW + 4);
        assert_eq!(r.reordered, 3);
    }

    #[test]
    fn csv_row_has_every_column() {
        let mut m = FlowMetrics::new(3, 0);
        m.on_sdu(10, &h(0, 0), 50);
        let row = m.report("rev", false, false).csv_row("tgen", "voip");
        assert_eq!(
            row.split(',').count(),
            FlowReport::CSV_HEADER.split(',').count()
        );
    }
}
