//! Request/response tests: transactions per second and their latency.
//!
//! The client writes a REQUEST of `request_size` bytes asking for a
//! RESPONSE of `response_size` bytes, and keeps up to `outstanding`
//! requests unanswered at a time: one at a time (`outstanding = 1`) measures
//! the round trip of a transaction, more measure how many the path and the
//! server sustain. A request unanswered after `timeout` is counted lost and
//! its slot reused (the flow may be unreliable); an answer that comes later
//! counts as `late`, not as a transaction.

use super::{write_request_header, Msg, REQUEST_HEADER};
use crate::stats::Summary;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Why a request/response test could not run.
#[derive(Debug, thiserror::Error)]
pub enum RrError {
    /// The request size is below [`REQUEST_HEADER`] or above the flow's max SDU.
    #[error("request size {size} is not within {min}..={max} bytes")]
    BadSize {
        /// The size asked for.
        size: usize,
        /// The smallest size (the header).
        min: usize,
        /// The flow's max SDU.
        max: usize,
    },
    /// `outstanding` is 0.
    #[error("at least one request must be outstanding")]
    NoOutstanding,
    /// The flow failed for good (closed, or its descriptor failed).
    #[error("{0}")]
    Flow(#[from] rina::Error),
}

/// What one request/response test does.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RrConfig {
    /// Test id (in every REQUEST and RESPONSE).
    pub test: u32,
    /// Bytes of each request (at least [`REQUEST_HEADER`]).
    pub request_size: usize,
    /// Bytes asked of each response (the server cuts it to its max SDU).
    pub response_size: u32,
    /// Requests kept unanswered at most.
    pub outstanding: usize,
    /// Stop after this many requests...
    pub count: Option<u64>,
    /// ...or once this long has passed since the first (then wait for the
    /// outstanding ones).
    pub duration: Duration,
    /// A request unanswered this long is lost.
    pub timeout: Duration,
}

/// The result of one request/response test.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RrResult {
    /// Test id.
    pub test: u32,
    /// Request size, bytes.
    pub request_size: usize,
    /// Response size asked for, bytes.
    pub response_size: u32,
    /// Requests kept outstanding at most (per flow).
    pub outstanding: usize,
    /// Requests written.
    pub requests: u64,
    /// Transactions completed (a response within the timeout).
    pub transactions: u64,
    /// Requests unanswered within the timeout.
    pub lost: u64,
    /// Responses that came after their timeout, or twice.
    pub late: u64,
    /// From the first request to the last response, seconds.
    pub duration_s: f64,
    /// Transactions per second.
    pub tps: f64,
    /// Lost requests, percent of requests.
    pub loss_pct: f64,
    /// Transaction latency (request written to response read), µs.
    pub latency_us: Option<Summary>,
    /// The latency samples, µs (for totals over flows; not printed).
    #[serde(skip)]
    pub samples_us: Vec<f64>,
}

impl RrResult {
    /// The same test run on several flows at once: counts and rates add up,
    /// the duration is the longest, the latency is over every transaction.
    /// `None` if `parts` is empty.
    pub fn total(parts: &[&RrResult]) -> Option<RrResult> {
        let first = parts.first()?;
        let mut samples = Vec::new();
        let mut t = RrResult {
            requests: 0,
            transactions: 0,
            lost: 0,
            late: 0,
            duration_s: 0.0,
            tps: 0.0,
            samples_us: Vec::new(),
            ..(*first).clone()
        };
        for p in parts {
            t.requests += p.requests;
            t.transactions += p.transactions;
            t.lost += p.lost;
            t.late += p.late;
            t.duration_s = t.duration_s.max(p.duration_s);
            t.tps += p.tps;
            samples.extend_from_slice(&p.samples_us);
        }
        t.loss_pct = crate::echo::loss_pct(t.requests, t.requests - t.lost.min(t.requests));
        t.latency_us = Summary::of(&samples);
        t.samples_us = samples;
        Some(t)
    }

    /// The CSV header matching [`RrResult::csv_row`].
    pub const CSV_HEADER: &'static str =
        "request_size,response_size,outstanding,requests,transactions,lost,tps,lat_min_us,lat_avg_us,lat_p50_us,lat_p90_us,lat_p99_us,lat_max_us";

    /// One CSV row (empty latency fields if no transaction completed).
    pub fn csv_row(&self) -> String {
        let lat = self.latency_us.map_or_else(
            || ",,,,,".to_string(),
            |l| {
                format!(
                    "{:.1},{:.1},{:.1},{:.1},{:.1},{:.1}",
                    l.min, l.avg, l.p50, l.p90, l.p99, l.max
                )
            },
        );
        format!(
            "{},{},{},{},{},{},{:.1},{lat}",
            self.request_size,
            self.response_size,
            self.outstanding,
            self.requests,
            self.transactions,
            self.lost,
            self.tps
        )
    }
}

/// Longest timeout and test duration taken (longer ones are cut to it, so
/// that deadlines never overflow the clock).
pub const MAX_WAIT: Duration = Duration::from_secs(365 * 24 * 3600);

/// The requests in flight, oldest first, and what became of the others.
#[derive(Debug)]
pub struct Inflight {
    queue: VecDeque<(u64, Instant)>,
    timeout: Duration,
    lost: u64,
    late: u64,
    samples_us: Vec<f64>,
}

impl Inflight {
    /// No request in flight yet; one unanswered for `timeout` (at most
    /// [`MAX_WAIT`]) is lost.
    pub fn new(timeout: Duration) -> Inflight {
        Inflight {
            queue: VecDeque::new(),
            timeout: timeout.min(MAX_WAIT),
            lost: 0,
            late: 0,
            samples_us: Vec::new(),
        }
    }

    /// Requests in flight.
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// True if no request is in flight.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Request `seq` was written at `at` (sequence numbers increase).
    pub fn sent(&mut self, seq: u64, at: Instant) {
        self.queue.push_back((seq, at));
    }

    /// The response to `seq` was read at `at`; returns its latency, or
    /// `None` (counted late) if `seq` is not in flight.
    pub fn answered(&mut self, seq: u64, at: Instant) -> Option<Duration> {
        let Some(i) = self.queue.iter().position(|&(s, _)| s == seq) else {
            self.late += 1;
            return None;
        };
        let (_, sent) = self.queue.remove(i)?;
        let lat = at.saturating_duration_since(sent);
        self.samples_us.push(lat.as_secs_f64() * 1e6);
        Some(lat)
    }

    /// Counts as lost every request sent `timeout` or more before `now`.
    pub fn expire(&mut self, now: Instant) {
        while let Some(&(_, sent)) = self.queue.front() {
            if now.saturating_duration_since(sent) < self.timeout {
                break;
            }
            self.queue.pop_front();
            self.lost += 1;
        }
    }

    /// When the oldest request in flight will be lost, if any is in flight.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.queue.front().map(|&(_, sent)| sent + self.timeout)
    }

    /// (transactions, lost, late) so far.
    pub fn counts(&self) -> (u64, u64, u64) {
        (self.samples_us.len() as u64, self.lost, self.late)
    }
}

/// Runs one request/response test on `flow` against a `rina-perf server`.
pub fn run(flow: &rina::Flow, cfg: &RrConfig) -> Result<RrResult, RrError> {
    if cfg.request_size < REQUEST_HEADER || cfg.request_size > flow.max_sdu() {
        return Err(RrError::BadSize {
            size: cfg.request_size,
            min: REQUEST_HEADER,
            max: flow.max_sdu(),
        });
    }
    if cfg.outstanding == 0 {
        return Err(RrError::NoOutstanding);
    }
    let mut req = vec![0u8; cfg.request_size];
    let mut buf = vec![0u8; flow.max_sdu().max(REQUEST_HEADER)];
    let mut inflight = Inflight::new(cfg.timeout);
    let duration = cfg.duration.min(MAX_WAIT);
    let start = Instant::now();
    let mut last_answer = start;
    let mut sent = 0u64;
    loop {
        let sending = match cfg.count {
            Some(n) => sent < n,
            None => start.elapsed() < duration,
        };
        if sending && inflight.len() < cfg.outstanding {
            write_request_header(&mut req, cfg.test, sent, cfg.response_size);
            flow.write(&req)?;
            inflight.sent(sent, Instant::now());
            sent += 1;
            continue;
        }
        let Some(deadline) = inflight.next_deadline() else {
            break;
        };
        // While sending, wake up at the end of the duration too.
        let wake = match (sending, cfg.count) {
            (true, None) => deadline.min(start + duration),
            _ => deadline,
        };
        let left = wake.saturating_duration_since(Instant::now());
        match flow.read_timeout(&mut buf, left) {
            Ok(Some(n)) => {
                if let Some(Msg::Response { test, seq }) = Msg::decode(&buf[..n]) {
                    let now = Instant::now();
                    if test == cfg.test && inflight.answered(seq, now).is_some() {
                        last_answer = now;
                    }
                }
            }
            Ok(None) => {}
            Err(e) if crate::opts::is_transient(&e) => {}
            Err(e) => return Err(e.into()),
        }
        inflight.expire(Instant::now());
    }
    let (transactions, lost, late) = inflight.counts();
    let duration_s = last_answer.saturating_duration_since(start).as_secs_f64();
    Ok(RrResult {
        test: cfg.test,
        request_size: cfg.request_size,
        response_size: cfg.response_size,
        outstanding: cfg.outstanding,
        requests: sent,
        transactions,
        lost,
        late,
        duration_s,
        tps: if duration_s > 0.0 {
            transactions as f64 / duration_s
        } else {
            0.0
        },
        loss_pct: crate::echo::loss_pct(sent, sent - lost.min(sent)),
        latency_us: Summary::of(&inflight.samples_us),
        samples_us: inflight.samples_us,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inflight_times_transactions_and_expires_the_unanswered() {
        let t0 = Instant::now();
        let ms = |i: u64| t0 + Duration::from_millis(i);
        let mut f = Inflight::new(Duration::from_millis(100));
        f.sent(0, ms(0));
        f.sent(1, ms(1));
        f.sent(2, ms(2));
        assert_eq!(f.next_deadline(), Some(ms(100)));
        // Answered out of order.
        assert_eq!(f.answered(1, ms(11)), Some(Duration::from_millis(10)));
        assert_eq!(f.len(), 2);
        // Nothing expires early; 0 expires at its deadline, 2 not yet.
        f.expire(ms(99));
        assert_eq!(f.len(), 2);
        f.expire(ms(100));
        assert_eq!((f.len(), f.next_deadline()), (1, Some(ms(102))));
        // The answer to 0 comes too late; 1 again is a duplicate.
        assert_eq!(f.answered(0, ms(120)), None);
        assert_eq!(f.answered(1, ms(121)), None);
        assert_eq!(f.answered(2, ms(42)), Some(Duration::from_millis(40)));
        assert!(f.is_empty() && f.next_deadline().is_none());
        assert_eq!(f.counts(), (2, 1, 2));
        assert_eq!(f.samples_us, vec![10_000.0, 40_000.0]);
        // An absurd timeout is cut, not an overflow.
        let mut f = Inflight::new(Duration::MAX);
        f.sent(0, t0);
        assert_eq!(f.next_deadline(), Some(t0 + MAX_WAIT));
    }

    fn result(tx: u64, lost: u64, tps: f64, samples: &[f64]) -> RrResult {
        RrResult {
            test: 1,
            request_size: 64,
            response_size: 128,
            outstanding: 2,
            requests: tx + lost,
            transactions: tx,
            lost,
            late: 1,
            duration_s: tps,
            tps,
            loss_pct: 0.0,
            latency_us: Summary::of(samples),
            samples_us: samples.to_vec(),
        }
    }

    #[test]
    fn totals_add_flows_up_and_merge_latencies() {
        let a = result(3, 1, 100.0, &[10.0, 20.0, 30.0]);
        let b = result(1, 0, 50.0, &[1000.0]);
        let t = RrResult::total(&[&a, &b]).expect("total");
        assert_eq!((t.requests, t.transactions, t.lost, t.late), (5, 4, 1, 2));
        assert_eq!((t.tps, t.duration_s), (150.0, 100.0));
        assert!((t.loss_pct - 20.0).abs() < 1e-9);
        let l = t.latency_us.expect("latency");
        assert_eq!((l.count, l.min, l.max), (4, 10.0, 1000.0));
        assert!(RrResult::total(&[]).is_none());
        assert_eq!(
            a.csv_row(),
            "64,128,2,4,3,1,100.0,10.0,20.0,20.0,28.0,29.8,30.0"
        );
        assert!(result(0, 2, 0.0, &[]).csv_row().ends_with(",0.0,,,,,,"));
    }

    #[test]
    fn a_test_against_the_server_completes_every_transaction() {
        // The server's max SDU is below the response size asked for: it
        // answers with what fits.
        let (client, server) = crate::testing::flows(1000, 600);
        let srv = std::thread::spawn(move || crate::perf::serve_flow(&server, |_| {}, |_| {}));
        let cfg = RrConfig {
            test: 9,
            request_size: 100,
            response_size: 900,
            outstanding: 4,
            count: Some(500),
            duration: Duration::ZERO,
            timeout: Duration::from_secs(5),
        };
        let r = run(&client, &cfg).expect("test");
        assert_eq!(
            (r.requests, r.transactions, r.lost, r.late),
            (500, 500, 0, 0)
        );
        assert!(r.tps > 0.0 && r.duration_s > 0.0, "{r:?}");
        assert_eq!(r.latency_us.map(|l| l.count), Some(500));
        // Sizes out of range are refused before anything is written.
        let bad = RrConfig {
            request_size: 20,
            ..cfg
        };
        assert!(matches!(run(&client, &bad), Err(RrError::BadSize { .. })));
        let none = RrConfig {
            outstanding: 0,
            ..cfg
        };
        assert!(matches!(run(&client, &none), Err(RrError::NoOutstanding)));
        drop(client);
        let served = srv.join().expect("server");
        assert!(served.error.is_none());
        assert_eq!(served.sdus, 500);
    }
}
