//! `rina-echo`'s probe format and report.
//!
//! A probe SDU is a big-endian `u64` sequence number, a big-endian `u64` send
//! time (nanoseconds of the sender's monotonic clock, see [`mono_ns`]), then
//! zero padding up to the probe size. The server sends every SDU back
//! unchanged; only the client interprets the contents.

use crate::opts::is_transient;
use crate::stats::Summary;
use crate::Served;
use rina::Flow;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Bytes of a probe's header; the smallest probe size.
pub const PROBE_HEADER: usize = 16;

/// Nanoseconds of a monotonic clock since this process first asked.
pub fn mono_ns() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    let start = *START.get_or_init(Instant::now);
    u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// Builds a probe of `size` bytes (at least [`PROBE_HEADER`]).
pub fn encode_probe(seq: u64, sent_ns: u64, size: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(size.max(PROBE_HEADER));
    v.extend_from_slice(&seq.to_be_bytes());
    v.extend_from_slice(&sent_ns.to_be_bytes());
    v.resize(size.max(PROBE_HEADER), 0);
    v
}

/// Reads `(seq, sent_ns)` from a probe; `None` if it is too short.
pub fn decode_probe(b: &[u8]) -> Option<(u64, u64)> {
    let seq = u64::from_be_bytes(b.get(0..8)?.try_into().ok()?);
    let t = u64::from_be_bytes(b.get(8..16)?.try_into().ok()?);
    Some((seq, t))
}

/// What `rina-echo client --json` prints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EchoReport {
    /// Destination application name.
    pub dst: String,
    /// DIF the flow ran in.
    pub dif: String,
    /// Port-id of the flow.
    pub port: u32,
    /// Probe size in bytes.
    pub size: usize,
    /// Probes sent.
    pub sent: u64,
    /// Replies received in time.
    pub received: u64,
    /// Probes without a reply in time (late replies included).
    pub lost: u64,
    /// Replies that came, but after the timeout (counted in `lost`).
    #[serde(default)]
    pub late: u64,
    /// Loss in percent of probes sent.
    pub loss_pct: f64,
    /// Round-trip time summary in milliseconds; absent if nothing came back.
    pub rtt_ms: Option<Summary>,
    /// Every round-trip time of a reply in time, in microseconds, in probe
    /// order.
    pub rtt_us: Vec<f64>,
    /// Time from the allocation request to the flow, in milliseconds.
    #[serde(default)]
    pub allocation_ms: Option<f64>,
}

/// Echoes every SDU of `flow` back until it is closed or fails for good;
/// `warn` hears about the errors it survives ([`crate::opts::is_transient`]).
pub fn serve_flow(flow: &Flow, mut warn: impl FnMut(&rina::Error)) -> Served {
    let mut buf = vec![0u8; flow.max_sdu().max(1)];
    let mut served = Served {
        sdus: 0,
        bytes: 0,
        error: None,
    };
    loop {
        let r = flow
            .read(&mut buf)
            .and_then(|n| flow.write(&buf[..n]).map(|()| n));
        match r {
            Ok(n) => {
                served.sdus += 1;
                served.bytes += n as u64;
            }
            Err(e) if e.is_closed() => return served,
            Err(e) if is_transient(&e) => warn(&e),
            Err(e) => {
                served.error = Some(e);
                return served;
            }
        }
    }
}

/// When probe `seq` is due: `interval` apart from `start_ns`, saturating
/// (a huge interval means "never", not an overflow).
pub fn due_ns(start_ns: u64, interval: Duration, seq: u64) -> u64 {
    let interval_ns = u64::try_from(interval.as_nanos()).unwrap_or(u64::MAX);
    start_ns.saturating_add(interval_ns.saturating_mul(seq))
}

/// What became of a reply (see [`Probes::on_reply`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyOutcome {
    /// In time; the round-trip time in nanoseconds.
    InTime(u64),
    /// After the timeout; the round-trip time in nanoseconds.
    Late(u64),
    /// For no probe in flight (a duplicate, a reply after its probe was
    /// given up as lost, or garbage).
    Unexpected,
}

/// The probes in flight of an echo client that sends on a fixed schedule,
/// whatever the replies do, and matches replies by sequence number as they
/// come. Times are nanoseconds of one monotonic clock ([`mono_ns`]).
///
/// A probe is answered in time if its reply comes within `timeout` of its
/// sending; once the timeout has passed ([`Probes::expire`]) it is lost, and
/// a reply that still comes is late.
#[derive(Debug)]
pub struct Probes {
    timeout_ns: u64,
    /// `(seq, sent_ns)` of probes not yet answered nor expired, oldest first.
    in_flight: VecDeque<(u64, u64)>,
    /// `(seq, sent_ns)` of expired probes, for late replies (bounded).
    expired: VecDeque<(u64, u64)>,
}

/// Expired probes remembered to recognise late replies.
const MAX_EXPIRED: usize = 4096;

impl Probes {
    /// No probe in flight; replies count within `timeout`.
    pub fn new(timeout: Duration) -> Probes {
        Probes {
            timeout_ns: u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX),
            in_flight: VecDeque::new(),
            expired: VecDeque::new(),
        }
    }

    /// Probe `seq` left at `now` (sequence numbers increase).
    pub fn sent(&mut self, seq: u64, now: u64) {
        self.in_flight.push_back((seq, now));
    }

    /// Probes in flight.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// When the oldest probe in flight expires, if any.
    pub fn next_expiry(&self) -> Option<u64> {
        self.in_flight
            .front()
            .map(|&(_, t)| t.saturating_add(self.timeout_ns))
    }

    /// Gives up the probes whose timeout has passed at `now`; returns their
    /// sequence numbers.
    pub fn expire(&mut self, now: u64) -> Vec<u64> {
        let mut lost = Vec::new();
        while let Some(&(seq, t)) = self.in_flight.front() {
            if now.saturating_sub(t) <= self.timeout_ns {
                break;
            }
            self.in_flight.pop_front();
            self.expired.push_back((seq, t));
            if self.expired.len() > MAX_EXPIRED {
                self.expired.pop_front();
            }
            lost.push(seq);
        }
        lost
    }

    /// The reply to probe `seq` came at `now`.
    pub fn on_reply(&mut self, seq: u64, now: u64) -> ReplyOutcome {
        if let Some(i) = self.in_flight.iter().position(|&(s, _)| s == seq) {
            let (_, t) = self.in_flight[i];
            let rtt = now.saturating_sub(t);
            if rtt <= self.timeout_ns {
                self.in_flight.remove(i);
                return ReplyOutcome::InTime(rtt);
            }
            // Not expired yet only because nobody asked: it is late.
            self.in_flight.remove(i);
            return ReplyOutcome::Late(rtt);
        }
        if let Some(i) = self.expired.iter().position(|&(s, _)| s == seq) {
            let (_, t) = self.expired[i];
            self.expired.remove(i);
            return ReplyOutcome::Late(now.saturating_sub(t));
        }
        ReplyOutcome::Unexpected
    }
}

/// Loss in percent; 0 when nothing was sent.
pub fn loss_pct(sent: u64, received: u64) -> f64 {
    if sent == 0 {
        0.0
    } else {
        100.0 * sent.saturating_sub(received) as f64 / sent as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_round_trip() {
        let p = encode_probe(3, 12345, 64);
        assert_eq!(p.len(), 64);
        assert_eq!(decode_probe(&p), Some((3, 12345)));
        assert_eq!(encode_probe(1, 2, 4).len(), PROBE_HEADER);
        assert_eq!(decode_probe(&p[..15]), None);
    }

    #[test]
    fn clock_is_monotonic() {
        let a = mono_ns();
        let b = mono_ns();
        assert!(b >= a);
    }

    #[test]
    fn server_survives_an_oversize_sdu_and_ends_on_close() {
        use std::os::fd::AsRawFd;
        let (flow, peer) = crate::testing::flow_pair(10);
        let send = |b: &[u8]| {
            nix::sys::socket::send(peer.as_raw_fd(), b, nix::sys::socket::MsgFlags::empty())
        };
        send(&[7u8; 11]).expect("oversize");
        send(b"hi").expect("send");
        let peer_fd = peer.as_raw_fd();
        let client = std::thread::spawn(move || {
            let mut buf = [0u8; 16];
            let n = nix::sys::socket::recv(peer_fd, &mut buf, nix::sys::socket::MsgFlags::empty())
                .expect("echo");
            drop(peer);
            buf[..n].to_vec()
        });
        let mut warnings = Vec::new();
        let served = serve_flow(&flow, |e| warnings.push(e.kind()));
        assert_eq!(client.join().expect("peer"), b"hi");
        assert_eq!(warnings, vec![rina::ErrorKind::SduTooLarge]);
        assert_eq!((served.sdus, served.bytes), (1, 2));
        assert!(served.error.is_none(), "{:?}", served.error);
    }

    #[test]
    fn server_gives_up_on_a_failing_flow() {
        let (flow, _w) = crate::testing::broken_flow();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut warnings = 0;
            let served = serve_flow(&flow, |_| warnings += 1);
            let _ = tx.send((served, warnings));
        });
        let (served, warnings) = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("serve_flow returned instead of looping");
        assert_eq!(warnings, 0);
        let e = served.error.expect("the error that ended it");
        assert_eq!(e.kind(), rina::ErrorKind::Internal, "{e}");
    }

    #[test]
    fn schedule_saturates() {
        let ms = Duration::from_millis(200);
        assert_eq!(due_ns(5, ms, 0), 5);
        assert_eq!(due_ns(5, ms, 3), 600_000_005);
        assert_eq!(due_ns(5, Duration::MAX, 2), u64::MAX);
        assert_eq!(due_ns(u64::MAX - 1, ms, 1), u64::MAX);
    }

    /// 200 ms interval, 1000 ms timeout: probe 0's reply is lost, the others
    /// answer after 50 ms (probe 3's after 1100 ms, late). Sending never
    /// waits for replies, and replies are matched by number.
    #[test]
    fn probes_match_replies_by_number_and_count_late_ones() {
        let ms = |m: u64| m * 1_000_000;
        let mut p = Probes::new(Duration::from_secs(1));
        assert_eq!(p.next_expiry(), None);
        p.sent(0, ms(0));
        p.sent(1, ms(200));
        assert_eq!(p.on_reply(1, ms(250)), ReplyOutcome::InTime(ms(50)));
        p.sent(2, ms(400));
        p.sent(3, ms(600));
        // Out of order is fine.
        p.sent(4, ms(800));
        assert_eq!(p.on_reply(4, ms(850)), ReplyOutcome::InTime(ms(50)));
        assert_eq!(p.on_reply(2, ms(900)), ReplyOutcome::InTime(ms(500)));
        assert_eq!(p.next_expiry(), Some(ms(1000)));
        // Exactly at the timeout still counts; 1 ns later it is lost.
        assert_eq!(p.expire(ms(1000)), Vec::<u64>::new());
        assert_eq!(p.expire(ms(1000) + 1), vec![0]);
        assert_eq!(p.in_flight(), 1);
        assert_eq!(p.next_expiry(), Some(ms(1600)));
        // Probe 3's reply after 1100 ms, before anyone expired it: late.
        assert_eq!(p.on_reply(3, ms(1700)), ReplyOutcome::Late(ms(1100)));
        // Probe 0's reply after all: late too; twice is unexpected.
        assert_eq!(p.on_reply(0, ms(1800)), ReplyOutcome::Late(ms(1800)));
        assert_eq!(p.on_reply(0, ms(1801)), ReplyOutcome::Unexpected);
        assert_eq!(p.on_reply(1, ms(1802)), ReplyOutcome::Unexpected);
        assert_eq!(p.in_flight(), 0);
        assert_eq!(p.next_expiry(), None);
    }

    #[test]
    fn loss() {
        assert_eq!(loss_pct(0, 0), 0.0);
        assert_eq!(loss_pct(10, 9), 10.0);
        assert_eq!(loss_pct(4, 0), 100.0);
    }
}
