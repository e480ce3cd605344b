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
//! | 4    | REPORT | `u32 test`, `u64 recv_sdus`, `u64 recv_bytes`, `u64 duration_ns`, `u64 duplicates`, `u64 out_of_order` |
//!
//! The client sends START, then DATA with `seq` 0, 1, 2..., then STOP every
//! 100 ms (at most 20 times) until the server answers with the REPORT of that
//! test. The flow may lose SDUs (UDP underneath), so the server never waits
//! for anything: DATA of a test it has not seen starts that test (START may be
//! lost), and a STOP is answered with what was received so far, every time.
//! `duration_ns` runs from the first to the last DATA received. Byte counts
//! are whole SDU lengths (header included).

use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};

/// First bytes of every perf SDU.
pub const MAGIC: [u8; 4] = *b"RPRF";
/// Bytes of a DATA header; the smallest DATA size.
pub const DATA_HEADER: usize = 4 + 1 + 4 + 8;

const T_START: u8 = 1;
const T_DATA: u8 = 2;
const T_STOP: u8 = 3;
const T_REPORT: u8 = 4;

/// What the receiver saw of one test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Report {
    /// Test id.
    pub test: u32,
    /// DATA SDUs received (duplicates included).
    pub recv_sdus: u64,
    /// Bytes of those SDUs.
    pub recv_bytes: u64,
    /// From the first to the last DATA received, in nanoseconds.
    pub duration_ns: u64,
    /// DATA SDUs whose sequence number had been seen before.
    pub duplicates: u64,
    /// DATA SDUs that arrived after one with a higher sequence number.
    pub out_of_order: u64,
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
            })),
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

/// Sequence numbers tracked for duplicate detection (2 MiB of bitmap).
const MAX_TRACKED_SEQ: u64 = 1 << 24;

/// The receiving side of perf tests on one flow.
#[derive(Debug, Default)]
pub struct Receiver {
    cur: Option<TestState>,
    history: Vec<Report>,
}

#[derive(Debug)]
struct TestState {
    report: Report,
    first: Option<Instant>,
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
            first: None,
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

    /// Handles one SDU received at `now`; returns the SDU to send back, if any.
    /// SDUs that are not perf messages are ignored.
    pub fn on_sdu(&mut self, sdu: &[u8], now: Instant) -> Option<Vec<u8>> {
        match Msg::decode(sdu)? {
            Msg::Start { test, .. } => {
                if !self.is_finished(test) {
                    self.switch_to(test);
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
                r.recv_sdus += 1;
                r.recv_bytes += sdu.len() as u64;
                let first = *st.first.get_or_insert(now);
                r.duration_ns = u64::try_from(now.saturating_duration_since(first).as_nanos())
                    .unwrap_or(u64::MAX);
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
            Msg::Report(_) => None,
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

/// Paces a sender to a bit rate: each SDU may leave once its deadline has
/// come; a sender that falls behind may catch up by at most `MAX_BURST`.
#[derive(Debug)]
pub struct Pacer {
    ns_per_byte: f64,
    next: Instant,
}

/// Largest catch-up burst of a [`Pacer`].
const MAX_BURST: Duration = Duration::from_millis(10);

impl Pacer {
    /// A pacer for `mbps` megabits per second (10⁶ bit/s); `None` if not positive.
    pub fn new(mbps: f64) -> Option<Pacer> {
        if mbps.is_nan() || mbps <= 0.0 {
            return None;
        }
        Some(Pacer {
            ns_per_byte: 8.0 * 1e3 / mbps,
            next: Instant::now(),
        })
    }

    /// Waits until an SDU of `bytes` may be sent.
    pub fn wait(&mut self, bytes: usize) {
        let mut now = Instant::now();
        if now > self.next + MAX_BURST {
            self.next = now - MAX_BURST;
        }
        while now < self.next {
            let left = self.next - now;
            if left > Duration::from_micros(1500) {
                std::thread::sleep(left - Duration::from_millis(1));
            } else {
                std::hint::spin_loop();
            }
            now = Instant::now();
        }
        self.next += Duration::from_nanos((bytes as f64 * self.ns_per_byte) as u64);
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
    /// Receiver goodput, in Mb/s, over first-to-last receive time.
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
        let unique = r.recv_sdus.saturating_sub(r.duplicates);
        TestResult {
            test: r.test,
            size,
            sent_sdus,
            sent_bytes,
            send_duration_s: tx_s,
            report: r,
            loss_pct: crate::echo::loss_pct(sent_sdus, unique.min(sent_sdus)),
            tx_mbps: rate(sent_bytes as f64 * 8.0 / 1e6, tx_s),
            tx_sdus_per_s: rate(sent_sdus as f64, tx_s),
            rx_mbps: rate(r.recv_bytes as f64 * 8.0 / 1e6, rx_s),
            rx_sdus_per_s: rate(r.recv_sdus as f64, rx_s),
        }
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
    /// One entry per test (per size with `--sweep`).
    pub tests: Vec<TestResult>,
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
        // START lost; DATA 0, 2, 1 (late), 2 (dup), 5.
        for (i, seq) in [0u64, 2, 1, 2, 5].into_iter().enumerate() {
            assert!(rx
                .on_sdu(&data(7, seq), t0 + Duration::from_millis(i as u64))
                .is_none());
        }
        let r = stop(&mut rx, 7);
        assert_eq!(r.test, 7);
        assert_eq!(r.recv_sdus, 5);
        assert_eq!(r.recv_bytes, 500);
        assert_eq!(r.duplicates, 1);
        assert_eq!(r.out_of_order, 1);
        assert_eq!(r.duration_ns, 4_000_000);
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

    #[test]
    fn results_compute_rates() {
        let r = Report {
            test: 1,
            recv_sdus: 900,
            recv_bytes: 900_000,
            duration_ns: 1_000_000_000,
            duplicates: 0,
            out_of_order: 0,
        };
        let t = TestResult::new(1000, 1000, 1_000_000, Duration::from_secs(1), r);
        assert!((t.loss_pct - 10.0).abs() < 1e-9);
        assert!((t.tx_mbps - 8.0).abs() < 1e-9);
        assert!((t.rx_mbps - 7.2).abs() < 1e-9);
        assert!((t.rx_sdus_per_s - 900.0).abs() < 1e-9);
        assert_eq!(t.csv_row(), "1000,1000,900,10.000,8.000,7.200,900.0");
        let z = TestResult::new(64, 0, 0, Duration::ZERO, Report::default());
        assert_eq!((z.tx_mbps, z.rx_mbps, z.loss_pct), (0.0, 0.0, 0.0));
    }

    #[test]
    fn pacer_rejects_bad_rates_and_paces() {
        assert!(Pacer::new(0.0).is_none());
        assert!(Pacer::new(f64::NAN).is_none());
        // 80 Mb/s = 10 bytes/µs: 20 SDUs of 10 000 bytes need ≥ 19 ms
        // (the first one leaves at once).
        let mut p = Pacer::new(80.0).expect("pacer");
        let t = Instant::now();
        for _ in 0..20 {
            p.wait(10_000);
        }
        assert!(t.elapsed() >= Duration::from_millis(19));
    }
}
