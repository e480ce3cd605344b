//! `rina-echo`'s probe format and report.
//!
//! A probe SDU is a big-endian `u64` sequence number, a big-endian `u64` send
//! time (nanoseconds of the sender's monotonic clock, see [`mono_ns`]), then
//! zero padding up to the probe size. The server sends every SDU back
//! unchanged; only the client interprets the contents.

use crate::stats::Summary;
use serde::{Deserialize, Serialize};
use std::sync::OnceLock;
use std::time::Instant;

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
    /// Probes without a reply in time.
    pub lost: u64,
    /// Loss in percent of probes sent.
    pub loss_pct: f64,
    /// Round-trip time summary in milliseconds; absent if nothing came back.
    pub rtt_ms: Option<Summary>,
    /// Every round-trip time, in microseconds, in probe order.
    pub rtt_us: Vec<f64>,
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
    fn loss() {
        assert_eq!(loss_pct(0, 0), 0.0);
        assert_eq!(loss_pct(10, 9), 10.0);
        assert_eq!(loss_pct(4, 0), 100.0);
    }
}
