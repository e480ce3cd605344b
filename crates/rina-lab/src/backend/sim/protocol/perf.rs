//! `rina-perf`'s throughput sweep in the protocol engine, with the tool's
//! own in-band protocol ([`rina_tools::perf`]): per SDU size a test of
//! `per_size`, START, DATA SDUs numbered 0, 1, 2..., then STOP every
//! 100 ms until the server's [`rina_tools::perf::Receiver`] (the one
//! `rina-perf server` runs) answers with its REPORT, which gives the
//! receive rate as the tool computes it ([`TestResult::new`]).
//!
//! The writer writes as fast as its stack takes SDUs: a flow-controlled
//! flow (a reliable cube's window and congestion control) refuses with
//! `WouldBlock` and says when it is writable again, as it makes
//! `rina-perf` wait on a real system; an unreliable flow takes everything,
//! so the writer stops while its own system holds [`BUFFER_PDUS`] PDUs in
//! its RMT queues, as `rinad` stops reading an application's ring while it
//! cannot send (what it writes beyond is lost where the policy says, on
//! the way).

use rina_tools::perf::{self, Msg, Report, TestResult};

/// PDUs its own system may hold queued before an unreliable writer waits.
pub(super) const BUFFER_PDUS: usize = 64;
/// Most SDUs a writer writes at one wake-up (links without a rate take
/// everything at once).
pub(super) const BURST_SDUS: usize = 4 * BUFFER_PDUS;
/// Interval of the STOPs of a test until its REPORT comes.
const STOP_EVERY_NS: u64 = 100_000_000;
/// How long a test's STOPs go on without a REPORT (`rina-perf`'s six
/// seconds after the data stopped draining).
const REPORT_WAIT_NS: u64 = 6_000_000_000;

/// One size's test.
#[derive(Debug, Clone)]
pub(super) struct PerfTest {
    /// DATA size, bytes.
    pub size: usize,
    /// DATA SDUs written.
    pub sent: u64,
    /// Bytes written.
    pub bytes: u64,
    started: u64,
    ended: u64,
    next_stop: Option<u64>,
    /// The server's REPORT, once it came.
    pub report: Option<Report>,
}

impl PerfTest {
    /// The tool's result of this test, if its REPORT came.
    pub fn result(&self) -> Option<TestResult> {
        let send = std::time::Duration::from_nanos(self.ended.saturating_sub(self.started));
        self.report
            .map(|r| TestResult::new(self.size, self.sent, self.bytes, send, r))
    }
}

/// A perf client's sweep over its sizes.
#[derive(Debug, Clone)]
pub(super) struct PerfClient {
    sizes: Vec<usize>,
    per: u64,
    stop: u64,
    /// The test being written, by index.
    cur: Option<usize>,
    period_end: u64,
    /// Tests so far, by size index.
    pub tests: Vec<PerfTest>,
    /// Waiting for the flow to be writable.
    pub blocked: bool,
    /// Test id of the first size (a new allocation starts new ids).
    first_test: u32,
}

impl PerfClient {
    /// A sweep over `sizes` (each at least a DATA header), `per` ns each,
    /// no DATA at or after `stop`.
    pub fn new(sizes: &[usize], per: u64, stop: u64, first_test: u32) -> Self {
        PerfClient {
            sizes: sizes.iter().map(|&s| s.max(perf::DATA_HEADER)).collect(),
            per: per.max(1),
            stop,
            cur: None,
            period_end: 0,
            tests: Vec::new(),
            blocked: false,
            first_test,
        }
    }

    fn test_id(&self, k: usize) -> u32 {
        self.first_test.wrapping_add(k as u32)
    }

    /// The control SDUs due at `now` (a START when a test begins, the
    /// STOPs of tests without a REPORT), the state moved on.
    pub fn control(&mut self, now: u64) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let next = match self.cur {
            None if self.tests.is_empty() => Some(0),
            Some(k) if now >= self.period_end || now >= self.stop => {
                let t = &mut self.tests[k];
                t.ended = now;
                t.next_stop = Some(now);
                (k + 1 < self.sizes.len()).then_some(k + 1)
            }
            _ => None,
        };
        if let Some(k) = next {
            if now < self.stop {
                self.tests.push(PerfTest {
                    size: self.sizes[k],
                    sent: 0,
                    bytes: 0,
                    started: now,
                    ended: now,
                    next_stop: None,
                    report: None,
                });
                self.cur = Some(k);
                self.period_end = now + self.per;
                let start = Msg::Start {
                    test: self.test_id(k),
                    size: self.sizes[k] as u32,
                };
                out.push(start.encode());
            } else {
                self.cur = None;
            }
        } else if self.cur.is_some_and(|k| self.tests[k].next_stop.is_some()) {
            self.cur = None;
        }
        for k in 0..self.tests.len() {
            let id = self.test_id(k);
            let t = &mut self.tests[k];
            let Some(at) = t.next_stop.filter(|&at| at <= now) else {
                continue;
            };
            if t.report.is_some() || now > t.ended + REPORT_WAIT_NS {
                t.next_stop = None;
                continue;
            }
            t.next_stop = Some(at + STOP_EVERY_NS);
            let stop = Msg::Stop {
                test: id,
                sent_sdus: t.sent,
                sent_bytes: t.bytes,
            };
            out.push(stop.encode());
        }
        out
    }

    /// The next DATA SDU to write, if a test is being written.
    pub fn data(&self) -> Option<Vec<u8>> {
        let k = self.cur?;
        let t = &self.tests[k];
        if t.next_stop.is_some() {
            return None;
        }
        let mut buf = vec![0u8; t.size];
        perf::write_data_header(&mut buf, self.test_id(k), t.sent);
        Some(buf)
    }

    /// Whether a test is sending DATA (not yet stopped).
    pub fn sending(&self) -> bool {
        self.cur.is_some_and(|k| self.tests[k].next_stop.is_none())
    }

    /// The DATA SDU [`PerfClient::data`] gave was written.
    pub fn wrote(&mut self, len: usize) {
        if let Some(t) = self.cur.map(|k| &mut self.tests[k]) {
            t.sent += 1;
            t.bytes += len as u64;
        }
    }

    /// When the sweep next has something to do on its own (the end of the
    /// current test, a STOP).
    pub fn next_at(&self) -> Option<u64> {
        let end = self.cur.map(|_| self.period_end.min(self.stop));
        let stops = self.tests.iter().filter_map(|t| t.next_stop);
        end.into_iter().chain(stops).min()
    }

    /// Takes a REPORT the server wrote back.
    pub fn on_sdu(&mut self, sdu: &[u8]) {
        if let Some(Msg::Report(r)) = Msg::decode(sdu) {
            let k = r.test.wrapping_sub(self.first_test) as usize;
            if let Some(t) = self.tests.get_mut(k) {
                t.report = Some(r);
                t.next_stop = None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two sizes of 1 s: START, DATA of the first, then at 1 s its STOP and
    /// the second's START; STOPs every 100 ms until the REPORT comes.
    #[test]
    fn a_sweep_starts_stops_and_takes_reports() {
        let s = 1_000_000_000;
        let mut p = PerfClient::new(&[100, 200], s, 10 * s, 7);
        let c = p.control(0);
        assert_eq!(c.len(), 1);
        assert!(matches!(
            Msg::decode(&c[0]),
            Some(Msg::Start { test: 7, size: 100 })
        ));
        let d = p.data().unwrap();
        assert_eq!(d.len(), 100);
        p.wrote(d.len());
        assert_eq!(p.next_at(), Some(s));
        let c = p.control(s);
        assert!(matches!(
            Msg::decode(&c[0]),
            Some(Msg::Start { test: 8, size: 200 })
        ));
        assert!(matches!(
            Msg::decode(&c[1]),
            Some(Msg::Stop {
                test: 7,
                sent_sdus: 1,
                sent_bytes: 100
            })
        ));
        assert_eq!(p.data().unwrap().len(), 200);
        assert_eq!(p.control(s + STOP_EVERY_NS).len(), 1);
        let report = Report {
            test: 7,
            recv_sdus: 1,
            ..Report::default()
        };
        p.on_sdu(&Msg::Report(report).encode());
        assert!(p.control(s + 2 * STOP_EVERY_NS).is_empty());
        assert_eq!(p.tests[0].result().unwrap().report.recv_sdus, 1);
        // The last test ends; no DATA after it.
        let c = p.control(2 * s);
        assert_eq!(c.len(), 1);
        assert!(p.data().is_none());
    }
}
