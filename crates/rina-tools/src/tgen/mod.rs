//! `rina-tgen`: a traffic generator and meter for RINA flows.
//!
//! * [`header`] — the 28-byte header of every SDU (flow id, sequence
//!   number, send time) and the message kinds.
//! * [`gen`] — [`gen::Generator`]: the pure schedule (send time, size) of a
//!   [`gen::Profile`] (CBR, Poisson, ON-OFF, seed 003 and 004 profiles) from
//!   a `u64` seed.
//! * [`metrics`] — [`metrics::FlowMetrics`]: the pure per-flow accumulator
//!   (loss, duplicates, reordering, one-way delay, RFC 3550 jitter, goodput,
//!   histogram) and its [`metrics::FlowReport`].
//! * [`matrix`] — the TOML traffic matrix: many flows per process.
//! * [`sender`] — [`sender::next_step`]: what a sender does next (write,
//!   sleep a bounded slice, stop at the flow's end).
//! * [`output`] — the CSV and JSON files (schema in `docs/rina-tgen.md`).
//!
//! The binary only does IO: it feeds these with the wall clock.

pub mod gen;
pub mod header;
pub mod matrix;
pub mod metrics;
pub mod output;
pub mod sender;

use serde::{Deserialize, Serialize};

/// Which way traffic flows, seen from the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Direction {
    /// Client to server only.
    Forward,
    /// Server to client only.
    Reverse,
    /// Both ways, the same profile (independent draws).
    #[default]
    Bidirectional,
}

impl std::fmt::Display for Direction {
    /// As the option and the matrix write it: `forward`, `reverse`,
    /// `bidirectional`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Direction::Forward => "forward",
            Direction::Reverse => "reverse",
            Direction::Bidirectional => "bidirectional",
        })
    }
}

impl Direction {
    /// Whether the client sends.
    pub fn client_sends(self) -> bool {
        self != Direction::Reverse
    }

    /// Whether the server sends.
    pub fn server_sends(self) -> bool {
        self != Direction::Forward
    }
}

/// The body of a HELLO: what the server must generate back, and how the
/// flow is described in the server's reports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hello {
    /// Flow id.
    pub flow: u32,
    /// The source (the server uses it for the reverse direction).
    pub source: gen::SourceSpec,
    /// Seed of the reverse direction's generator.
    pub seed: u64,
    /// Length of the flow, s.
    pub duration_s: f64,
    /// Which way traffic flows.
    pub direction: Direction,
}

/// Nanoseconds since the Unix epoch on the real-time clock.
pub fn realtime_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}
