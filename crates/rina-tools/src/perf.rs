//! `rina-perf`'s in-band protocol, its receiver and its reports.
//!
//! Every SDU of a test starts with the magic `RPRF` and a type byte; all
//! integers are big-endian:
//!
//! | type | name   | body after magic + type                                                        |
//! |------|--------|--------------------------------------------------------------------------------|
//! | 1    | START  | `u32 test`, `u32 size` (the DATA size)                                         |
//! | 2    | DATA   | `u32 test`, `u64 seq`, zero padding to the test's size                         |
//! | 3    | STOP   | `u32 test`, `u64 sent_sdus`, `u64 sent_bytes`                                  |
//! | 4    | REPORT | `u32 test`, `u64 recv_sdus`, `u64 recv_bytes`, `u64 duration_ns`, `u64 duplicates`, `u64 out_of_order`, `u64 timed_sdus`, `u64 timed_bytes` |
//! | 5    | REQUEST  | `u32 test`, `u64 seq`, `u32 response_size`, zero padding to the request size |
//! | 6    | RESPONSE | `u32 test`, `u64 seq`, zero padding to the response size                     |
//!
//! The client sends START, then DATA with `seq` 0, 1, 2..., then STOP every
//! 100 ms until the server answers with the REPORT of that test, for as long
//! as the DATA written before keeps draining and for 6 s after it stopped:
//! the REPORT queues behind that DATA. The flow may lose SDUs (UDP
//! underneath), so the server never waits for anything: DATA of a test it
//! has not seen starts that test (START may be lost), and a STOP is answered with what was received so far, every time.
//! Byte counts are whole SDU lengths (header included); SDU and byte counts
//! are of distinct DATA SDUs (a duplicate counts only in `duplicates`).
//!
//! # Receive rate
//!
//! `duration_ns` runs from the test's time origin to the last DATA received,
//! and `timed_sdus`/`timed_bytes` are what arrived after the origin; the
//! receive rate is `timed_bytes / duration_ns`. The origin is the arrival of
//! START when it came before any DATA (then every DATA SDU is timed: one SDU
//! already gives a rate). When START was lost or overtaken, the origin is the
//! arrival of the first DATA, which therefore is not timed: N SDUs spread
//! over N − 1 gaps, and dividing all N by that time would overstate the rate
//! by N/(N − 1).
//!
//! # Request/response
//!
//! A request/response test (`rina-perf client --test rr`, rlite's `rinaperf
//! -t rr`) needs no START or STOP: the server answers every REQUEST at once
//! with a RESPONSE of the same test and sequence number, `response_size`
//! bytes long (at least [`RESPONSE_HEADER`], at most the flow's max SDU), and
//! keeps no state. The client keeps up to a configured number of requests
//! outstanding and measures each transaction's round trip ([`rr`]).

pub mod rr;

use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};

/// First bytes of every perf SDU.
pub const MAGIC: [u8; 4] = *b"RPRF";
/// Bytes of a DATA header; the smallest DATA size.
pub const DATA_HEADER: usize = 4 + 1 + 4 + 8;

/// Largest DATA SDU or request a test writes, bytes: 1 MiB, as rina-lab
/// allows (no DIF carries more than 65,536; the buffer is allocated
/// before the flow says so).
pub const MAX_SIZE: usize = 1 << 20;
/// Bytes of a REQUEST header; the smallest request size.
pub const REQUEST_HEADER: usize = DATA_HEADER + 4;
/// Bytes of a RESPONSE header; the smallest response size.
pub const RESPONSE_HEADER: usize = DATA_HEADER;

const T_START: u8 = 1;
const T_DATA: u8 = 2;
const T_STOP: u8 = 3;
const T_REPORT: u8 = 4;
const T_REQUEST: u8 = 5;
const T_RESPONSE: u8 = 6;

/// What the receiver saw of one test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Report {
    /// Test id.
    pub test: u32,
    /// Distinct DATA SDUs received (duplicates not included).
    pub recv_sdus: u64,
    /// Bytes of those SDUs.
    pub recv_bytes: u64,
    /// From the time origin (START, or the first DATA if START did not come
    /// first) to the last DATA received, in nanoseconds.
    pub duration_ns: u64,
    /// DATA SDUs whose sequence number had been seen before.
    pub duplicates: u64,
    /// DATA SDUs that arrived after one with a higher sequence number.
    pub out_of_order: u64,
    /// Distinct DATA SDUs received after the time origin (the rate's SDUs).
    #[serde(default)]
    pub timed_sdus: u64,
    /// Bytes of those SDUs (the rate's bytes).
    #[serde(default)]
    pub timed_bytes: u64,
}

/// One perf SDU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Msg {
    /// A test begins; DATA will be `size` bytes.
    Start {
        /// Test id.
        test: u32,
        /// DATA size.
        size: u32,
    },
    /// Payload.
    Data {
        /// Test id.
        test: u32,
        /// Sequence number, from 0.
        seq: u64,
    },
    /// The sender is done; asks for the REPORT.
    Stop {
        /// Test id.
        test: u32,
        /// DATA SDUs written.
        sent_sdus: u64,
        /// Bytes of those SDUs.
        sent_bytes: u64,
    },
    /// The receiver's answer to STOP.
    Report(Report),
    /// A request of a request/response test.
    Request {
        /// Test id.
        test: u32,
        /// Sequence number of the transaction.
        seq: u64,
        /// Bytes the response is to have.
        response_size: u32,
    },
    /// The answer to a REQUEST.
    Response {
        /// Test id.
        test: u32,
        /// The request's sequence number.
        seq: u64,
    },
}

impl Msg {
    /// Encodes the message (DATA without padding: see [`write_data_header`]).
    pub fn encode(&self) -> Vec<u8> {
        let mut v = MAGIC.to_vec();
        match *self {
            Msg::Start { test, size } => {
                v.push(T_START);
                v.extend_from_slice(&test.to_be_bytes());
                v.extend_from_slice(&size.to_be_bytes());
            }
            Msg::Data { test, seq } => {
                v.push(T_DATA);
                v.extend_from_slice(&test.to_be_bytes());
                v.extend_from_slice(&seq.to_be_bytes());
            }
            Msg::Request {
                test,
                seq,
                response_size,
            } => {
                v.push(T_REQUEST);
                v.extend_from_slice(&test.to_be_bytes());
                v.extend_from_slice(&seq.to_be_bytes());
                v.extend_from_slice(&response_size.to_be_bytes());
            }
            Msg::Response { test, seq } => {
                v.push(T_RESPONSE);
                v.extend_from_slice(&test.to_be_bytes());
                v.extend_from_slice(&seq.to_be_bytes());
            }
            Msg::Stop {
                test,
                sent_sdus,
                sent_bytes,
            } => {
                v.push(T_STOP);
                v.extend_from_slice(&test.to_be_bytes());
                v.extend_from_slice(&sent_sdus.to_be_bytes());
                v.extend_from_slice(&sent_bytes.to_be_bytes());
            }
            Msg::Report(r) => {
                v.push(T_REPORT);
                v.extend_from_slice(&r.test.to_be_bytes());
                for x in [
                    r.recv_sdus,
                    r.recv_bytes,
                    r.duration_ns,
                    r.duplicates,
                    r.out_of_order,
                    r.timed_sdus,
                    r.timed_bytes,
                ] {
                    v.extend_from_slice(&x.to_be_bytes());
                }
            }
        }
        v
    }

    /// Decodes a perf SDU; `None` if it is not one (bad magic, type or length).
    pub fn decode(b: &[u8]) -> Option<Msg> {
        if b.get(0..4)? != MAGIC {
            return None;
        }
        let t = *b.get(4)?;
        let test = u32_at(b, 5)?;
        match t {
            T_START => Some(Msg::Start {
                test,
                size: u32_at(b, 9)?,
            }),
            T_DATA => Some(Msg::Data {
                test,
                seq: u64_at(b, 9)?,
            }),
            T_STOP => Some(Msg::Stop {
                test,
                sent_sdus: u64_at(b, 9)?,
                sent_bytes: u64_at(b, 17)?,
            }),
            T_REPORT => Some(Msg::Report(Report {
                test,
                recv_sdus: u64_at(b, 9)?,
                recv_bytes: u64_at(b, 17)?,
                duration_ns: u64_at(b, 25)?,
                duplicates: u64_at(b, 33)?,
                out_of_order: u64_at(b, 41)?,
                timed_sdus: u64_at(b, 49)?,
                timed_bytes: u64_at(b, 57)?,
            })),
            T_REQUEST => Some(Msg::Request {
                test,
                seq: u64_at(b, 9)?,
                response_size: u32_at(b, 17)?,
            }),
            T_RESPONSE => Some(Msg::Response {
                test,
                seq: u64_at(b, 9)?,
            }),
            _ => None,
        }
    }
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_be_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// Writes a DATA header at the start of `buf` (at least [`DATA_HEADER`]
/// bytes; the rest is left as padding). Returns false if `buf` is too short.
pub fn write_data_header(buf: &mut [u8], test: u32, seq: u64) -> bool {
    let Some(h) = buf.get_mut(..DATA_HEADER) else {
        return false;
    };
    h[..4].copy_from_slice(&MAGIC);
    h[4] = T_DATA;
    h[5..9].copy_from_slice(&test.to_be_bytes());
    h[9..17].copy_from_slice(&seq.to_be_bytes());
    true
}

/// Writes a REQUEST header at the start of `buf` (at least
/// [`REQUEST_HEADER`] bytes; the rest is left as padding). Returns false if
/// `buf` is too short.
pub fn write_request_header(buf: &mut [u8], test: u32, seq: u64, response_size: u32) -> bool {
    if !write_data_header(buf, test, seq) || buf.len() < REQUEST_HEADER {
        return false;
    }
    buf[4] = T_REQUEST;
    buf[17..21].copy_from_slice(&response_size.to_be_bytes());
    true
}

/// The RESPONSE to a REQUEST: `response_size` bytes, clamped to
/// [`RESPONSE_HEADER`]..=`max` (the flow's max SDU).
pub fn response(test: u32, seq: u64, response_size: u32, max: usize) -> Vec<u8> {
    let len = (response_size as usize).min(max).max(RESPONSE_HEADER);
    let mut v = vec![0u8; len];
    write_data_header(&mut v, test, seq);
    v[4] = T_RESPONSE;
    v
}

/// Sequence numbers tracked for duplicate detection (2 MiB of bitmap).
const MAX_TRACKED_SEQ: u64 = 1 << 24;

/// The receiving side of perf tests on one flow.
#[derive(Debug)]
pub struct Receiver {
    cur: Option<TestState>,
    history: Vec<Report>,
    /// Largest RESPONSE it writes (the flow's max SDU).
    max_response: usize,
}

impl Default for Receiver {
    fn default() -> Self {
        Receiver {
            cur: None,
            history: Vec::new(),
            max_response: usize::from(u16::MAX),
        }
    }
}

#[derive(Debug)]
struct TestState {
    report: Report,
    /// The time origin: START's arrival, or the first DATA's.
    origin: Option<Instant>,
    seen: Vec<u64>,
    max_seq: Option<u64>,
}

impl TestState {
    fn new(test: u32) -> TestState {
        TestState {
            report: Report {
                test,
                ..Report::default()
            },
            origin: None,
            seen: Vec::new(),
            max_seq: None,
        }
    }
}

impl Receiver {
    /// A receiver with no test yet.
    pub fn new() -> Receiver {
        Receiver::default()
    }

    /// A receiver whose RESPONSEs are at most `max` bytes (the flow's max
    /// SDU); larger requested sizes are cut to it.
    pub fn with_max_response(max: usize) -> Receiver {
        Receiver {
            max_response: max,
            ..Receiver::default()
        }
    }

    /// Handles one SDU received at `now`; returns the SDU to send back, if any.
    /// SDUs that are not perf messages are ignored.
    pub fn on_sdu(&mut self, sdu: &[u8], now: Instant) -> Option<Vec<u8>> {
        match Msg::decode(sdu)? {
            Msg::Start { test, .. } => {
                if !self.is_finished(test) {
                    // START is the origin only if no DATA overtook it.
                    self.switch_to(test).origin.get_or_insert(now);
                }
                None
            }
            Msg::Data { test, seq } => {
                if self.is_finished(test) {
                    // Late DATA of a test that was followed by another one.
                    return None;
                }
                let st = self.switch_to(test);
                let r = &mut st.report;
                if seq < MAX_TRACKED_SEQ {
                    let (w, bit) = ((seq / 64) as usize, 1u64 << (seq % 64));
                    if st.seen.len() <= w {
                        st.seen.resize(w + 1, 0);
                    }
                    if st.seen[w] & bit != 0 {
                        r.duplicates += 1;
                        return None;
                    }
                    st.seen[w] |= bit;
                }
                let len = sdu.len() as u64;
                r.recv_sdus += 1;
                r.recv_bytes += len;
                match st.origin {
                    // The first DATA is the origin: it starts the clock and
                    // is not timed itself.
                    None => st.origin = Some(now),
                    Some(origin) => {
                        r.timed_sdus += 1;
                        r.timed_bytes += len;
                        r.duration_ns =
                            u64::try_from(now.saturating_duration_since(origin).as_nanos())
                                .unwrap_or(u64::MAX);
                    }
                }
                match st.max_seq {
                    Some(m) if seq < m => r.out_of_order += 1,
                    _ => st.max_seq = Some(seq),
                }
                None
            }
            Msg::Stop { test, .. } => {
                let report = match &self.cur {
                    Some(st) if st.report.test == test => st.report,
                    _ => self
                        .history
                        .iter()
                        .rev()
                        .find(|r| r.test == test)
                        .copied()
                        .unwrap_or(Report {
                            test,
                            ..Report::default()
                        }),
                };
                Some(Msg::Report(report).encode())
            }
            Msg::Request {
                test,
                seq,
                response_size,
            } => Some(response(test, seq, response_size, self.max_response)),
            Msg::Report(_) | Msg::Response { .. } => None,
        }
    }

    fn is_finished(&self, test: u32) -> bool {
        self.cur.as_ref().is_some_and(|s| s.report.test != test)
            && self.history.iter().any(|r| r.test == test)
    }

    fn switch_to(&mut self, test: u32) -> &mut TestState {
        if self.cur.as_ref().is_some_and(|s| s.report.test != test) {
            if let Some(old) = self.cur.take() {
                self.history.push(old.report);
                if self.history.len() > 8 {
                    self.history.remove(0);
                }
            }
        }
        self.cur.get_or_insert_with(|| TestState::new(test))
    }
}

/// Answers the perf tests on `flow` until it is closed or fails for good;
/// `on_report` sees every REPORT before it is sent, `warn` the errors it
/// survives ([`crate::opts::is_transient`]).
pub fn serve_flow(
    flow: &rina::Flow,
    mut on_report: impl FnMut(&Report),
    mut warn: impl FnMut(&rina::Error),
) -> crate::Served {
    let mut rx = Receiver::with_max_response(flow.max_sdu());
    let mut buf = vec![0u8; flow.max_sdu().max(1)];
    let mut served = crate::Served {
        sdus: 0,
        bytes: 0,
        error: None,
    };
    loop {
        let r = flow.read(&mut buf).and_then(|n| {
            served.sdus += 1;
            served.bytes += n as u64;
            match rx.on_sdu(&buf[..n], Instant::now()) {
                Some(reply) => {
                    if let Some(Msg::Report(r)) = Msg::decode(&reply) {
                        on_report(&r);
                    }
                    flow.write(&reply)
                }
                None => Ok(()),
            }
        });
        match r {
            Ok(()) => {}
            Err(e) if e.is_closed() => return served,
            Err(e) if crate::opts::is_transient(&e) => warn(&e),
            Err(e) => {
                served.error = Some(e);
                return served;
            }
        }
    }
}

/// The time source of a [`Pacer`]: the real clock ([`SystemClock`]) or, in
/// tests, a virtual one.
pub trait Clock {
    /// The current time.
    fn now(&self) -> Instant;
    /// Returns once [`Clock::now`] has reached `deadline`.
    fn sleep_until(&self, deadline: Instant);
}

/// The real clock: sleeps most of a wait and spins the last millisecond,
/// since `thread::sleep` may overshoot by that much.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn sleep_until(&self, deadline: Instant) {
        loop {
            let now = Instant::now();
            let Some(left) = deadline
                .checked_duration_since(now)
                .filter(|l| !l.is_zero())
            else {
                return;
            };
            if left > Duration::from_micros(1500) {
                std::thread::sleep(left - Duration::from_millis(1));
            } else {
                std::hint::spin_loop();
            }
        }
    }
}

/// The real clock without spinning: sleeps the whole wait, with the
/// thread's timer slack lowered to 1 µs (once per thread) so that the
/// kernel wakes it within its scheduling latency rather than up to 50 µs
/// late. For senders that run many at once beside the daemons (`rina-tgen`
/// serves a node's every flow with a thread each): [`SystemClock`]'s spin
/// of up to a millisecond per SDU would take the CPU they share.
#[derive(Debug, Clone, Copy, Default)]
pub struct SleepClock;

impl Clock for SleepClock {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn sleep_until(&self, deadline: Instant) {
        thread_local! {
            static SLACK_SET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
        }
        SLACK_SET.with(|set| {
            if !set.get() {
                // Only the calling thread's; a failure leaves the default
                // slack, which is harmless.
                let _ = nix::sys::prctl::set_timerslack(1_000);
                set.set(true);
            }
        });
        let now = Instant::now();
        if let Some(left) = deadline.checked_duration_since(now) {
            if !left.is_zero() {
                std::thread::sleep(left);
            }
        }
    }
}

/// Paces a sender to a bit rate: each SDU may leave once its turn has
/// come; a sender that falls behind may catch up by at most `MAX_BURST`.
#[derive(Debug)]
pub struct Pacer<C: Clock = SystemClock> {
    clock: C,
    ns_per_byte: f64,
    /// The next SDU's turn; `None` once it is beyond the clock's range.
    next: Option<Instant>,
    /// Fraction of a nanosecond owed by the SDUs so far (kept so rates that
    /// are not a whole number of ns per SDU do not drift).
    frac_ns: f64,
}

/// Largest catch-up burst of a [`Pacer`].
pub const MAX_BURST: Duration = Duration::from_millis(10);

/// Slowest rate `rina-perf` paces to, Mb/s: 1 bit/s (a 1400-byte SDU
/// every 3 hours).
pub const MIN_RATE_MBPS: f64 = 1e-6;

/// Fastest rate `rina-perf` paces to, Mb/s: 1 Tb/s, rinad's fastest link.
pub const MAX_RATE_MBPS: f64 = 1e6;

/// A pacing rate for clap (`--rate-mbps`): from [`MIN_RATE_MBPS`] to
/// [`MAX_RATE_MBPS`] (a rate of 10^-9 Mb/s held a test for days between
/// two SDUs).
pub fn parse_rate_mbps(s: &str) -> Result<f64, String> {
    let x = crate::opts::parse_positive(s)?;
    if (MIN_RATE_MBPS..=MAX_RATE_MBPS).contains(&x) {
        Ok(x)
    } else {
        Err(format!(
            "{s} Mb/s is not a pace: it must be from {MIN_RATE_MBPS:e} (1 bit/s) to \
             {MAX_RATE_MBPS:e} (1 Tb/s)"
        ))
    }
}

impl Pacer {
    /// A pacer for `mbps` megabits per second (10⁶ bit/s) on the real clock;
    /// `None` if not positive.
    pub fn new(mbps: f64) -> Option<Pacer> {
        Pacer::with_clock(mbps, SystemClock)
    }
}

impl<C: Clock> Pacer<C> {
    /// A pacer for `mbps` megabits per second on `clock`; `None` if the rate
    /// is not positive.
    pub fn with_clock(mbps: f64, clock: C) -> Option<Pacer<C>> {
        if mbps.is_nan() || mbps <= 0.0 {
            return None;
        }
        let next = Some(clock.now());
        Some(Pacer {
            clock,
            ns_per_byte: 8.0 * 1e3 / mbps,
            next,
            frac_ns: 0.0,
        })
    }

    /// Waits until an SDU of `bytes` may be sent, but never past `deadline`
    /// (the end of the test): true when it may go, false if its turn comes
    /// only after the deadline (returned at the deadline) or beyond the
    /// clock's range (returned at once without a deadline), when the sender
    /// should stop.
    pub fn wait(&mut self, bytes: usize, deadline: Option<Instant>) -> bool {
        let now = self.clock.now();
        let Some(mut next) = self.next else {
            if let Some(d) = deadline.filter(|&d| d > now) {
                self.clock.sleep_until(d);
            }
            return false;
        };
        if now
            .checked_duration_since(next)
            .is_some_and(|late| late > MAX_BURST)
        {
            next = now - MAX_BURST;
        }
        if now < next {
            if let Some(d) = deadline.filter(|&d| d < next) {
                if now < d {
                    self.clock.sleep_until(d);
                }
                self.next = Some(next);
                return false;
            }
            self.clock.sleep_until(next);
        }
        let cost = bytes as f64 * self.ns_per_byte + self.frac_ns;
        let whole = cost.floor();
        self.frac_ns = cost - whole;
        // A cost beyond u64 ns (584 years) saturates; a turn beyond the
        // clock's range is never.
        self.next = next.checked_add(Duration::from_nanos(whole as u64));
        true
    }
}

/// The result of one test, as `rina-perf client` reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TestResult {
    /// Test id.
    pub test: u32,
    /// DATA size in bytes.
    pub size: usize,
    /// DATA SDUs written.
    pub sent_sdus: u64,
    /// Bytes written.
    pub sent_bytes: u64,
    /// Time spent writing, in seconds.
    pub send_duration_s: f64,
    /// What the receiver reported.
    pub report: Report,
    /// Loss in percent of SDUs sent (duplicates do not count as received).
    pub loss_pct: f64,
    /// Sender goodput, in Mb/s (10⁶ bit/s).
    pub tx_mbps: f64,
    /// Sender rate, in SDUs per second.
    pub tx_sdus_per_s: f64,
    /// Receiver goodput, in Mb/s: distinct SDUs only, over the receive time
    /// (see the module's "Receive rate").
    pub rx_mbps: f64,
    /// Receiver rate, in SDUs per second.
    pub rx_sdus_per_s: f64,
}

impl TestResult {
    /// Computes the rates of a test.
    pub fn new(size: usize, sent_sdus: u64, sent_bytes: u64, send: Duration, r: Report) -> Self {
        let rate = |n: f64, secs: f64| if secs > 0.0 { n / secs } else { 0.0 };
        let tx_s = send.as_secs_f64();
        let rx_s = r.duration_ns as f64 / 1e9;
        TestResult {
            test: r.test,
            size,
            sent_sdus,
            sent_bytes,
            send_duration_s: tx_s,
            report: r,
            loss_pct: crate::echo::loss_pct(sent_sdus, r.recv_sdus.min(sent_sdus)),
            tx_mbps: rate(sent_bytes as f64 * 8.0 / 1e6, tx_s),
            tx_sdus_per_s: rate(sent_sdus as f64, tx_s),
            rx_mbps: rate(r.timed_bytes as f64 * 8.0 / 1e6, rx_s),
            rx_sdus_per_s: rate(r.timed_sdus as f64, rx_s),
        }
    }

    /// The sum of the same test run on several flows at once: counts and
    /// rates add up, the durations are the longest, loss is of the sums.
    /// The receivers' counts are the servers' word: their sums saturate at
    /// `u64::MAX` rather than wrap. `None` if `parts` is empty.
    pub fn total(parts: &[&TestResult]) -> Option<TestResult> {
        let first = parts.first()?;
        let mut t = TestResult {
            loss_pct: 0.0,
            tx_mbps: 0.0,
            tx_sdus_per_s: 0.0,
            rx_mbps: 0.0,
            rx_sdus_per_s: 0.0,
            sent_sdus: 0,
            sent_bytes: 0,
            send_duration_s: 0.0,
            report: Report {
                test: first.report.test,
                ..Report::default()
            },
            ..(*first).clone()
        };
        for p in parts {
            t.sent_sdus = t.sent_sdus.saturating_add(p.sent_sdus);
            t.sent_bytes = t.sent_bytes.saturating_add(p.sent_bytes);
            t.send_duration_s = t.send_duration_s.max(p.send_duration_s);
            t.tx_mbps += p.tx_mbps;
            t.tx_sdus_per_s += p.tx_sdus_per_s;
            t.rx_mbps += p.rx_mbps;
            t.rx_sdus_per_s += p.rx_sdus_per_s;
            let (r, q) = (&mut t.report, &p.report);
            for (sum, x) in [
                (&mut r.recv_sdus, q.recv_sdus),
                (&mut r.recv_bytes, q.recv_bytes),
                (&mut r.duplicates, q.duplicates),
                (&mut r.out_of_order, q.out_of_order),
                (&mut r.timed_sdus, q.timed_sdus),
                (&mut r.timed_bytes, q.timed_bytes),
            ] {
                *sum = sum.saturating_add(x);
            }
            r.duration_ns = r.duration_ns.max(q.duration_ns);
        }
        let received = parts
            .iter()
            .map(|p| p.report.recv_sdus.min(p.sent_sdus))
            .fold(0u64, u64::saturating_add);
        t.loss_pct = crate::echo::loss_pct(t.sent_sdus, received);
        Some(t)
    }

    /// The CSV header matching [`TestResult::csv_row`].
    pub const CSV_HEADER: &'static str =
        "size,sent_sdus,recv_sdus,loss_pct,tx_mbps,rx_mbps,rx_sdus_per_s";

    /// One CSV row.
    pub fn csv_row(&self) -> String {
        format!(
            "{},{},{},{:.3},{:.3},{:.3},{:.1}",
            self.size,
            self.sent_sdus,
            self.report.recv_sdus,
            self.loss_pct,
            self.tx_mbps,
            self.rx_mbps,
            self.rx_sdus_per_s
        )
    }
}

/// What `rina-perf client --json` prints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PerfReport {
    /// Destination application name.
    pub dst: String,
    /// DIF the flow ran in.
    pub dif: String,
    /// Port-id of the flow.
    pub port: u32,
    /// One entry per throughput test (per size with `--sweep`); with
    /// several flows (`--parallel`), the total of the flows ([`TestResult::total`]).
    pub tests: Vec<TestResult>,
    /// One entry per request/response test (`--test rr`); with several
    /// flows, the total of the flows ([`rr::RrResult::total`]).
    #[serde(default)]
    pub rr: Vec<rr::RrResult>,
    /// Every flow's own results, in the order they were allocated.
    #[serde(default)]
    pub flows: Vec<FlowReport>,
    /// Time from the first flow's allocation request to the flow, in
    /// milliseconds.
    #[serde(default)]
    pub allocation_ms: Option<f64>,
}

/// The results of one flow of a `rina-perf client` run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FlowReport {
    /// Port-id of the flow.
    pub port: u32,
    /// Throughput tests on this flow.
    pub tests: Vec<TestResult>,
    /// Request/response tests on this flow.
    pub rr: Vec<rr::RrResult>,
    /// Why a test on this flow failed, if one did.
    pub error: Option<String>,
    /// Time from this flow's allocation request to the flow, in
    /// milliseconds.
    #[serde(default)]
    pub allocation_ms: Option<f64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip() {
        let msgs = [
            Msg::Start { test: 1, size: 64 },
            Msg::Data { test: 1, seq: 99 },
            Msg::Stop {
                test: 1,
                sent_sdus: 5,
                sent_bytes: 320,
            },
            Msg::Report(Report {
                test: 1,
                recv_sdus: 4,
                recv_bytes: 256,
                duration_ns: 7,
                duplicates: 1,
                out_of_order: 2,
                timed_sdus: 3,
                timed_bytes: 192,
            }),
        ];
        for m in msgs {
            assert_eq!(Msg::decode(&m.encode()), Some(m));
        }
        assert_eq!(Msg::decode(b"RPRF\x09\0\0\0\0"), None);
        assert_eq!(Msg::decode(b"XXXX\x01\0\0\0\0\0\0\0\0"), None);
        assert_eq!(Msg::decode(b"RPRF\x03\0\0\0\x01"), None);
        let mut buf = [0u8; 64];
        assert!(write_data_header(&mut buf, 3, 4));
        assert_eq!(Msg::decode(&buf), Some(Msg::Data { test: 3, seq: 4 }));
        assert!(!write_data_header(&mut buf[..10], 3, 4));
        let req = Msg::Request {
            test: 3,
            seq: 4,
            response_size: 500,
        };
        assert_eq!(Msg::decode(&req.encode()), Some(req));
        assert!(write_request_header(&mut buf, 3, 4, 500));
        assert_eq!(Msg::decode(&buf), Some(req));
        assert!(!write_request_header(&mut buf[..20], 3, 4, 500));
        let resp = Msg::Response { test: 3, seq: 4 };
        assert_eq!(Msg::decode(&resp.encode()), Some(resp));
    }

    #[test]
    fn the_receiver_answers_requests_with_the_size_asked_within_bounds() {
        let mut rx = Receiver::with_max_response(300);
        let t0 = Instant::now();
        let mut req = [0u8; 40];
        for (asked, got) in [(100u32, 100usize), (5, RESPONSE_HEADER), (10_000, 300)] {
            assert!(write_request_header(&mut req, 2, 7, asked));
            let out = rx.on_sdu(&req, t0).expect("a response");
            assert_eq!(out.len(), got);
            assert_eq!(Msg::decode(&out), Some(Msg::Response { test: 2, seq: 7 }));
        }
        // Requests leave no trace in the throughput tests' reports.
        assert_eq!(stop(&mut rx, 2).recv_sdus, 0);
    }

    fn data(test: u32, seq: u64) -> Vec<u8> {
        let mut b = vec![0u8; 100];
        write_data_header(&mut b, test, seq);
        b
    }

    fn stop(rx: &mut Receiver, test: u32) -> Report {
        let out = rx
            .on_sdu(
                &Msg::Stop {
                    test,
                    sent_sdus: 0,
                    sent_bytes: 0,
                }
                .encode(),
                Instant::now(),
            )
            .expect("a report");
        match Msg::decode(&out) {
            Some(Msg::Report(r)) => r,
            other => panic!("not a report: {other:?}"),
        }
    }

    #[test]
    fn receiver_counts_loss_duplicates_and_reordering() {
        let mut rx = Receiver::new();
        let t0 = Instant::now();
        let ms = |i: u64| t0 + Duration::from_millis(i);
        // START lost; DATA 0, 2, 1 (late), 2 (dup), 5, one per millisecond.
        for (i, seq) in [0u64, 2, 1, 2, 5].into_iter().enumerate() {
            assert!(rx.on_sdu(&data(7, seq), ms(i as u64)).is_none());
        }
        let r = stop(&mut rx, 7);
        assert_eq!(r.test, 7);
        // The duplicate is not received data.
        assert_eq!(r.recv_sdus, 4);
        assert_eq!(r.recv_bytes, 400);
        assert_eq!(r.duplicates, 1);
        assert_eq!(r.out_of_order, 1);
        // Without START the first DATA is the origin and is not timed.
        assert_eq!(r.duration_ns, 4_000_000);
        assert_eq!((r.timed_sdus, r.timed_bytes), (3, 300));
        // STOP repeated: same answer.
        assert_eq!(stop(&mut rx, 7), r);
        // A new test; a late STOP of the old one still gets the old report.
        rx.on_sdu(&Msg::Start { test: 8, size: 100 }.encode(), t0);
        rx.on_sdu(&data(8, 0), t0);
        assert_eq!(stop(&mut rx, 7), r);
        assert_eq!(stop(&mut rx, 8).recv_sdus, 1);
        // Late DATA of test 7 neither counts nor switches back.
        rx.on_sdu(&data(7, 9), t0);
        assert_eq!(stop(&mut rx, 8).recv_sdus, 1);
        assert_eq!(stop(&mut rx, 7), r);
        // A STOP for a test never seen: zeros.
        assert_eq!(stop(&mut rx, 99).recv_sdus, 0);
        // Garbage is ignored.
        assert!(rx.on_sdu(b"hello", t0).is_none());
    }

    /// Exact goodput on explicit time: the receive rate is neither inflated
    /// by duplicates nor by counting N SDUs over N − 1 gaps.
    #[test]
    fn receive_rate_counts_distinct_sdus_over_the_right_time() {
        let t0 = Instant::now();
        let ms = |i: u64| t0 + Duration::from_millis(i);
        // 1000-byte SDUs, one per ms = exactly 8 Mb/s.
        let rate = |r: Report| TestResult::new(100, 11, 1100, Duration::from_millis(10), r);

        // START at 0, DATA 0..=9 at 1..=10 ms, each also duplicated.
        let mut rx = Receiver::new();
        rx.on_sdu(&Msg::Start { test: 1, size: 100 }.encode(), ms(0));
        for seq in 0..10u64 {
            rx.on_sdu(&data(1, seq), ms(seq + 1));
            rx.on_sdu(&data(1, seq), ms(seq + 1));
        }
        let r = stop(&mut rx, 1);
        assert_eq!((r.recv_sdus, r.recv_bytes, r.duplicates), (10, 1000, 10));
        assert_eq!(
            (r.timed_sdus, r.timed_bytes, r.duration_ns),
            (10, 1000, 10_000_000)
        );
        let t = rate(r);
        assert!((t.rx_mbps - 0.8).abs() < 1e-9, "{}", t.rx_mbps);
        assert!(
            (t.rx_sdus_per_s - 1000.0).abs() < 1e-9,
            "{}",
            t.rx_sdus_per_s
        );
        assert!((t.loss_pct - 100.0 / 11.0).abs() < 1e-9, "{}", t.loss_pct);

        // START lost: the same stream measured from DATA 0 gives the same rate.
        let mut rx = Receiver::new();
        for seq in 0..10u64 {
            rx.on_sdu(&data(2, seq), ms(seq + 1));
        }
        let t = rate(stop(&mut rx, 2));
        assert_eq!(t.report.recv_sdus, 10);
        assert_eq!((t.report.timed_sdus, t.report.duration_ns), (9, 9_000_000));
        assert!((t.rx_mbps - 0.8).abs() < 1e-9, "{}", t.rx_mbps);
        assert!((t.rx_sdus_per_s - 1000.0).abs() < 1e-9);

        // One SDU after START still has a rate.
        let mut rx = Receiver::new();
        rx.on_sdu(&Msg::Start { test: 3, size: 100 }.encode(), ms(0));
        rx.on_sdu(&data(3, 0), ms(1));
        let t = rate(stop(&mut rx, 3));
        assert!((t.rx_mbps - 0.8).abs() < 1e-9, "{}", t.rx_mbps);

        // START overtaken by DATA is not the origin.
        let mut rx = Receiver::new();
        rx.on_sdu(&data(4, 0), ms(5));
        rx.on_sdu(&Msg::Start { test: 4, size: 100 }.encode(), ms(6));
        rx.on_sdu(&data(4, 1), ms(6));
        let r = stop(&mut rx, 4);
        assert_eq!((r.timed_sdus, r.duration_ns), (1, 1_000_000));
    }

    #[test]
    fn results_compute_rates() {
        let r = Report {
            test: 1,
            recv_sdus: 901,
            recv_bytes: 901_000,
            duration_ns: 1_000_000_000,
            duplicates: 0,
            out_of_order: 0,
            timed_sdus: 900,
            timed_bytes: 900_000,
        };
        let t = TestResult::new(1000, 1000, 1_000_000, Duration::from_secs(1), r);
        assert!((t.loss_pct - 9.9).abs() < 1e-9);
        assert!((t.tx_mbps - 8.0).abs() < 1e-9);
        assert!((t.rx_mbps - 7.2).abs() < 1e-9);
        assert!((t.rx_sdus_per_s - 900.0).abs() < 1e-9);
        assert_eq!(t.csv_row(), "1000,1000,901,9.900,8.000,7.200,900.0");
        let z = TestResult::new(64, 0, 0, Duration::ZERO, Report::default());
        assert_eq!((z.tx_mbps, z.rx_mbps, z.loss_pct), (0.0, 0.0, 0.0));
    }

    #[test]
    fn a_pacer_never_sleeps_past_the_deadline() {
        let t0 = Instant::now();
        let clock = FakeClock {
            now: std::cell::Cell::new(t0),
            sleeps: std::cell::RefCell::new(Vec::new()),
        };
        let deadline = t0 + Duration::from_secs(1);
        // 10^-9 Mb/s: 1400 bytes take 130 days, and the sender slept them
        // through whatever --duration-s said.
        let mut p = Pacer::with_clock(1e-9, &clock).expect("pacer");
        assert!(p.wait(1400, Some(deadline)));
        assert_eq!(clock.now.get(), t0);
        assert!(!p.wait(1400, Some(deadline)));
        assert_eq!(clock.now.get(), deadline);
        assert_eq!(*clock.sleeps.borrow(), vec![deadline]);
        // Past the deadline: no sleep at all.
        assert!(!p.wait(1400, Some(deadline)));
        assert_eq!(clock.sleeps.borrow().len(), 1);
        // An SDU due before the deadline still goes.
        let mut p = Pacer::with_clock(80.0, &clock).expect("pacer");
        assert!(p.wait(10_000, Some(deadline + Duration::from_millis(2))));
        assert!(p.wait(10_000, Some(deadline + Duration::from_millis(2))));
        assert_eq!(clock.now.get(), deadline + Duration::from_millis(1));
        assert!(parse_rate_mbps("1e-9").unwrap_err().contains("not a pace"));
        assert!(parse_rate_mbps("2e6").is_err());
        assert!(parse_rate_mbps("0")
            .unwrap_err()
            .contains("not a number above 0"));
        assert_eq!(parse_rate_mbps("1e-6"), Ok(1e-6));
        assert_eq!(parse_rate_mbps("1e6"), Ok(1e6));
    }

    #[test]
    fn totals_of_a_servers_extreme_counts_saturate() {
        // A server's REPORT says what it likes: two flows of u64::MAX
        // overflowed the sums (a panic in a debug build).
        let r = Report {
            test: 1,
            recv_sdus: u64::MAX,
            recv_bytes: u64::MAX,
            duplicates: u64::MAX,
            out_of_order: u64::MAX,
            timed_sdus: u64::MAX,
            timed_bytes: u64::MAX,
            duration_ns: 7,
        };
        let a = TestResult::new(100, u64::MAX, u64::MAX, Duration::from_secs(1), r);
        let t = TestResult::total(&[&a, &a]).unwrap();
        assert_eq!((t.sent_sdus, t.sent_bytes), (u64::MAX, u64::MAX));
        let q = t.report;
        assert_eq!(
            [q.recv_sdus, q.recv_bytes, q.duplicates, q.out_of_order],
            [u64::MAX; 4]
        );
        assert_eq!(
            (q.timed_sdus, q.timed_bytes, q.duration_ns),
            (u64::MAX, u64::MAX, 7)
        );
        assert_eq!(t.loss_pct, 0.0);
    }

    #[test]
    fn server_answers_stop_and_gives_up_on_a_failing_flow() {
        use nix::sys::socket::{recv, send, MsgFlags};
        use std::os::fd::AsRawFd;
        let (flow, peer) = crate::testing::flow_pair(200);
        let p = peer.as_raw_fd();
        send(p, &data(5, 0), MsgFlags::empty()).expect("data");
        send(p, &[0u8; 201], MsgFlags::empty()).expect("oversize");
        let stop = Msg::Stop {
            test: 5,
            sent_sdus: 1,
            sent_bytes: 100,
        };
        send(p, &stop.encode(), MsgFlags::empty()).expect("stop");
        let peer_side = std::thread::spawn(move || {
            let mut buf = [0u8; 200];
            let n = recv(peer.as_raw_fd(), &mut buf, MsgFlags::empty()).expect("report");
            drop(peer);
            Msg::decode(&buf[..n])
        });
        let mut reports = Vec::new();
        let mut warnings = 0;
        let served = serve_flow(&flow, |r| reports.push(*r), |_| warnings += 1);
        let Some(Msg::Report(r)) = peer_side.join().expect("peer") else {
            panic!("no report");
        };
        assert_eq!((r.test, r.recv_sdus), (5, 1));
        assert_eq!(reports, vec![r]);
        assert_eq!(warnings, 1);
        assert!(served.error.is_none());

        let (flow, _w) = crate::testing::broken_flow();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(serve_flow(&flow, |_| {}, |_| {}));
        });
        let served = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("serve_flow returned instead of looping");
        assert!(served.error.is_some());
    }

    /// CPU time of the calling thread.
    fn thread_cpu() -> Duration {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid timespec for the call to fill.
        let r = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        assert_eq!(r, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
        Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
    }

    /// Sleeps 100 times for `gap` on `clock`; returns the thread's CPU time
    /// over the wall time, whether any sleep returned early, and the median
    /// lateness.
    fn sleeping_cost(clock: impl Clock, gap: Duration) -> (f64, bool, Duration) {
        let (cpu0, wall0) = (thread_cpu(), Instant::now());
        let mut early = false;
        let mut late = Vec::new();
        for _ in 0..100 {
            let deadline = Instant::now() + gap;
            clock.sleep_until(deadline);
            let now = Instant::now();
            early |= now < deadline;
            late.push(now.saturating_duration_since(deadline));
        }
        let cpu = (thread_cpu() - cpu0).as_secs_f64();
        late.sort();
        (cpu / wall0.elapsed().as_secs_f64(), early, late[50])
    }

    #[test]
    fn the_sleeping_clock_waits_without_spinning() {
        // Gaps of 1.2 ms, which SystemClock spends spinning whole: the
        // sleeping clock must keep its thread off the CPU (a thread that
        // spins is on it nearly all the time, unless preempted).
        let gap = Duration::from_micros(1200);
        let (sleeping, early, sleep_late) = sleeping_cost(SleepClock, gap);
        assert!(!early, "SleepClock returned before its deadline");
        assert!(
            sleeping < 0.2,
            "SleepClock used {:.0} % of a CPU",
            sleeping * 100.0
        );
        let (spinning, early, spin_late) = sleeping_cost(SystemClock, gap);
        assert!(!early, "SystemClock returned before its deadline");
        eprintln!(
            "CPU while waiting: SleepClock {:.1} %, SystemClock {:.1} %; \
             median lateness {sleep_late:?} and {spin_late:?}",
            sleeping * 100.0,
            spinning * 100.0
        );
    }

    /// A virtual clock: `sleep_until` jumps to the deadline and records it.
    struct FakeClock {
        now: std::cell::Cell<Instant>,
        sleeps: std::cell::RefCell<Vec<Instant>>,
    }

    impl Clock for &FakeClock {
        fn now(&self) -> Instant {
            self.now.get()
        }
        fn sleep_until(&self, deadline: Instant) {
            assert!(deadline > self.now.get(), "sleeps only when early");
            self.sleeps.borrow_mut().push(deadline);
            self.now.set(deadline);
        }
    }

    #[test]
    fn pacer_rejects_bad_rates_and_paces_exactly() {
        assert!(Pacer::new(0.0).is_none());
        assert!(Pacer::new(-1.0).is_none());
        assert!(Pacer::new(f64::NAN).is_none());
        let t0 = Instant::now();
        let clock = FakeClock {
            now: std::cell::Cell::new(t0),
            sleeps: std::cell::RefCell::new(Vec::new()),
        };
        let at = |us: u64| t0 + Duration::from_micros(us);
        // 80 Mb/s = 10 bytes/µs: an SDU of 10 000 bytes every 1000 µs, the
        // first at once.
        let mut p = Pacer::with_clock(80.0, &clock).expect("pacer");
        let mut departures = Vec::new();
        for _ in 0..20 {
            assert!(p.wait(10_000, None));
            departures.push(clock.now.get());
        }
        let want: Vec<Instant> = (0..20).map(|i| at(i * 1000)).collect();
        assert_eq!(departures, want);
        assert_eq!(clock.sleeps.borrow().len(), 19);

        // A sender 50 ms late may catch up by MAX_BURST (10 SDUs) only.
        clock.sleeps.borrow_mut().clear();
        clock.now.set(at(70_000));
        let mut departures = Vec::new();
        for _ in 0..12 {
            assert!(p.wait(10_000, Some(at(100_000))));
            departures.push(clock.now.get());
        }
        // The one due now and 10 ms of credit leave at once, then 1 per ms.
        let mut want = vec![at(70_000); 11];
        want.push(at(71_000));
        assert_eq!(departures, want);

        // Rates that are not a whole number of ns per SDU do not drift:
        // 3 Mb/s, 1-byte SDUs = 2666.67 ns each; 3000 SDUs take exactly 8 ms.
        let clock = FakeClock {
            now: std::cell::Cell::new(t0),
            sleeps: std::cell::RefCell::new(Vec::new()),
        };
        let mut p = Pacer::with_clock(3.0, &clock).expect("pacer");
        for _ in 0..=3000 {
            p.wait(1, None);
        }
        let took = clock.now.get() - t0;
        assert!(
            took.abs_diff(Duration::from_millis(8)) <= Duration::from_nanos(1),
            "{took:?}"
        );
    }
}
