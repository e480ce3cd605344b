//! `rina-perf`'s throughput sweep in the protocol engine, with the tool's
//! own in-band protocol ([`rina_tools::perf`]): per SDU size a test of
//! `per_size`, START, DATA SDUs numbered 0, 1, 2..., then STOP every
//! 100 ms until the server's [`rina_tools::perf::Receiver`] (the one
//! `rina-perf server` runs) answers with its REPORT, which gives the
//! receive rate as the tool computes it ([`TestResult::new`]). As the
//! tool's sweep does, the next size's test begins once that REPORT came:
//! a STOP never queues behind the next size's DATA (on a full link it
//! would be lost there, every 100 ms, for as long as the sweep ran).
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
use std::collections::VecDeque;

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
    /// When the next STOP is due, while the test waits for its REPORT.
    next_stop: Option<u64>,
    /// Over: its REPORT came, or its STOPs gave up.
    done: bool,
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

    /// Writing DATA: neither stopped nor over.
    fn sending(&self) -> bool {
        !self.done && self.next_stop.is_none()
    }
}

/// A perf client's sweep over its sizes, one test at a time as
/// `rina-perf client --sweep` runs them: a size's test begins once the
/// REPORT of the one before came (or its STOPs gave up), so no STOP queues
/// behind the next size's DATA.
#[derive(Debug, Clone)]
pub(super) struct PerfClient {
    sizes: Vec<usize>,
    per: u64,
    stop: u64,
    /// The test being written or stopped, by index.
    cur: Option<usize>,
    period_end: u64,
    /// Tests so far, by size index.
    pub tests: Vec<PerfTest>,
    /// Waiting for the flow to be writable.
    pub blocked: bool,
    /// Test id of the first size (a new allocation starts new ids).
    first_test: u32,
    /// Control SDUs due that the flow has not taken yet, oldest first:
    /// `rina-perf` blocks in its write until the flow takes them.
    unsent: VecDeque<Vec<u8>>,
}

impl PerfClient {
    /// A sweep over `sizes` (each at least a DATA header), `per` ns each,
    /// no test begun at or after `stop`.
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
            unsent: VecDeque::new(),
        }
    }

    fn test_id(&self, k: usize) -> u32 {
        self.first_test.wrapping_add(k as u32)
    }

    /// The next control SDU to write: one [`PerfClient::control`] made due
    /// that the flow has not taken yet.
    pub fn next_control(&self) -> Option<&[u8]> {
        self.unsent.front().map(Vec::as_slice)
    }

    /// The flow took the SDU [`PerfClient::next_control`] gave (or it is
    /// gone, and so is the flow).
    pub fn control_taken(&mut self) {
        self.unsent.pop_front();
    }

    /// Makes the control SDUs due at `now` (a test's STOPs once its period
    /// is over, the next test's START once it has its REPORT), the state
    /// moved on; [`PerfClient::next_control`] gives them.
    pub fn control(&mut self, now: u64) {
        if let Some(k) = self.cur {
            let (period_end, stop, id) = (self.period_end, self.stop, self.test_id(k));
            let t = &mut self.tests[k];
            if t.sending() && (now >= period_end || now >= stop) {
                t.ended = now;
                t.next_stop = Some(now);
            }
            if let Some(at) = t.next_stop.filter(|&at| at <= now) {
                if now > t.ended + REPORT_WAIT_NS {
                    t.next_stop = None;
                    t.done = true;
                } else {
                    t.next_stop = Some(at + STOP_EVERY_NS);
                    // (As the tool: a STOP once the one before has left.)
                    if self.unsent.is_empty() {
                        let stop = Msg::Stop {
                            test: id,
                            sent_sdus: t.sent,
                            sent_bytes: t.bytes,
                        };
                        self.unsent.push_back(stop.encode());
                    }
                }
            }
        }
        let next = match self.cur {
            None if self.tests.is_empty() => Some(0),
            Some(k) if self.tests[k].done => Some(k + 1),
            _ => None,
        };
        if let Some(k) = next {
            if k < self.sizes.len() && now < self.stop {
                self.tests.push(PerfTest {
                    size: self.sizes[k],
                    sent: 0,
                    bytes: 0,
                    started: now,
                    ended: now,
                    next_stop: None,
                    done: false,
                    report: None,
                });
                self.cur = Some(k);
                self.period_end = now + self.per;
                let start = Msg::Start {
                    test: self.test_id(k),
                    size: self.sizes[k] as u32,
                };
                self.unsent.push_back(start.encode());
            } else {
                self.cur = None;
            }
        }
    }

    /// The next DATA SDU to write, if a test is being written and its
    /// START was taken.
    pub fn data(&self) -> Option<Vec<u8>> {
        let k = self.cur?;
        let t = &self.tests[k];
        if !t.sending() || !self.unsent.is_empty() {
            return None;
        }
        let mut buf = vec![0u8; t.size];
        perf::write_data_header(&mut buf, self.test_id(k), t.sent);
        Some(buf)
    }

    /// Whether a test is sending DATA (not yet stopped).
    pub fn sending(&self) -> bool {
        self.cur.is_some_and(|k| self.tests[k].sending())
    }

    /// The DATA SDU [`PerfClient::data`] gave was written.
    pub fn wrote(&mut self, len: usize) {
        if let Some(t) = self.cur.map(|k| &mut self.tests[k]) {
            t.sent += 1;
            t.bytes += len as u64;
        }
    }

    /// When the sweep next has something to do on its own (the end of the
    /// current test's period, its next STOP, the next test once it is
    /// over).
    pub fn next_at(&self) -> Option<u64> {
        let t = &self.tests[self.cur?];
        if t.done {
            Some(t.ended)
        } else {
            t.next_stop.or(Some(self.period_end.min(self.stop)))
        }
    }

    /// Takes a REPORT the server wrote back.
    pub fn on_sdu(&mut self, sdu: &[u8]) {
        if let Some(Msg::Report(r)) = Msg::decode(sdu) {
            let k = r.test.wrapping_sub(self.first_test) as usize;
            if let Some(t) = self.tests.get_mut(k) {
                t.report = Some(r);
                t.next_stop = None;
                t.done = true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The control SDUs due at `now`, all taken by the flow.
    fn control(p: &mut PerfClient, now: u64) -> Vec<Vec<u8>> {
        p.control(now);
        let mut v = Vec::new();
        while let Some(m) = p.next_control() {
            v.push(m.to_vec());
            p.control_taken();
        }
        v
    }

    /// Two sizes of 1 s: START, DATA of the first, then at 1 s its STOPs
    /// every 100 ms and no DATA; the second's START once the REPORT came.
    #[test]
    fn a_sweep_starts_the_next_size_once_the_report_came() {
        let s = 1_000_000_000;
        let mut p = PerfClient::new(&[100, 200], s, 10 * s, 7);
        let c = control(&mut p, 0);
        assert_eq!(c.len(), 1);
        assert!(matches!(
            Msg::decode(&c[0]),
            Some(Msg::Start { test: 7, size: 100 })
        ));
        let d = p.data().unwrap();
        assert_eq!(d.len(), 100);
        p.wrote(d.len());
        assert_eq!(p.next_at(), Some(s));
        let c = control(&mut p, s);
        assert_eq!(c.len(), 1, "a STOP and no START yet");
        assert!(matches!(
            Msg::decode(&c[0]),
            Some(Msg::Stop {
                test: 7,
                sent_sdus: 1,
                sent_bytes: 100
            })
        ));
        assert!(p.data().is_none() && !p.sending());
        assert_eq!(p.next_at(), Some(s + STOP_EVERY_NS));
        let c = control(&mut p, s + STOP_EVERY_NS);
        assert!(matches!(
            Msg::decode(&c[0]),
            Some(Msg::Stop { test: 7, .. })
        ));
        let report = Report {
            test: 7,
            recv_sdus: 1,
            ..Report::default()
        };
        p.on_sdu(&Msg::Report(report).encode());
        assert!(p.next_at().is_some_and(|t| t <= s + STOP_EVERY_NS + 1));
        let t = s + STOP_EVERY_NS + 1;
        let c = control(&mut p, t);
        assert_eq!(c.len(), 1);
        assert!(matches!(
            Msg::decode(&c[0]),
            Some(Msg::Start { test: 8, size: 200 })
        ));
        assert_eq!(p.data().unwrap().len(), 200);
        assert_eq!(p.tests[0].result().unwrap().report.recv_sdus, 1);
        // The last test ends at its own period; no DATA after it.
        assert_eq!(p.next_at(), Some(t + s));
        let c = control(&mut p, t + s);
        assert_eq!(c.len(), 1);
        assert!(p.data().is_none());
    }

    /// A test whose REPORT never comes is given up 6 s after its DATA
    /// ended, and the sweep goes on with the next size.
    #[test]
    fn a_test_without_a_report_is_given_up_and_the_sweep_goes_on() {
        let s = 1_000_000_000;
        let mut p = PerfClient::new(&[100, 200], s, 20 * s, 0);
        control(&mut p, 0);
        let mut now = s;
        let mut stops = 0;
        while p.tests.len() < 2 {
            stops += control(&mut p, now)
                .iter()
                .filter(|m| matches!(Msg::decode(m), Some(Msg::Stop { .. })))
                .count();
            now = p.next_at().unwrap();
        }
        assert_eq!(stops, 61, "STOPs from 1 s to 7 s, one every 100 ms");
        assert!(p.tests[0].result().is_none());
        assert!(p.sending() && p.data().unwrap().len() == 200);
    }

    /// A control SDU the flow does not take waits, first in line: no DATA
    /// before a START is taken, and no second STOP before the first.
    #[test]
    fn control_sdus_the_flow_refuses_wait_in_order() {
        let s = 1_000_000_000;
        let mut p = PerfClient::new(&[100], s, 10 * s, 0);
        p.control(0);
        assert!(p.data().is_none(), "DATA before its START");
        assert!(matches!(
            p.next_control().and_then(Msg::decode),
            Some(Msg::Start { .. })
        ));
        p.control_taken();
        assert!(p.data().is_some());
        p.control(s);
        p.control(s + STOP_EVERY_NS);
        p.control(s + 2 * STOP_EVERY_NS);
        assert!(matches!(
            p.next_control().and_then(Msg::decode),
            Some(Msg::Stop { test: 0, .. })
        ));
        p.control_taken();
        assert!(p.next_control().is_none(), "STOPs piled up");
    }
}
