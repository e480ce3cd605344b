//! Pieces shared by the scheduling policies: per-queue counters, the bounded
//! management queue, and a small seeded random generator.

use super::{QueueStats, QueuedPdu};
use std::collections::VecDeque;

/// Counters of one queue: what [`QueueStats`] reports.
#[derive(Debug, Clone, Default)]
pub(crate) struct Tally {
    pub queued: usize,
    pub sent: u64,
    pub dropped: u64,
    pub max: usize,
}

impl Tally {
    /// A PDU joined the queue.
    pub fn push(&mut self) {
        self.queued += 1;
        self.max = self.max.max(self.queued);
    }

    /// A PDU left the queue to be sent.
    pub fn pop(&mut self) {
        self.queued = self.queued.saturating_sub(1);
        self.sent += 1;
    }

    /// A queued PDU was discarded.
    pub fn discard(&mut self) {
        self.queued = self.queued.saturating_sub(1);
        self.dropped += 1;
    }

    /// A PDU was refused before it joined the queue.
    pub fn refuse(&mut self) {
        self.dropped += 1;
    }

    /// The counters under the queue's name.
    pub fn stats(&self, name: impl Into<String>) -> QueueStats {
        QueueStats {
            queue: name.into(),
            queued: self.queued,
            sent: self.sent,
            dropped: self.dropped,
            max_occupancy: self.max,
        }
    }
}

/// Layer-management PDUs of a port: served before any data, bounded.
#[derive(Debug, Clone)]
pub(crate) struct MgmtQueue {
    q: VecDeque<QueuedPdu>,
    cap: usize,
    pub tally: Tally,
}

impl MgmtQueue {
    pub fn new(cap: usize) -> Self {
        MgmtQueue {
            q: VecDeque::new(),
            cap: cap.max(1),
            tally: Tally::default(),
        }
    }

    /// Queues `pdu`, or gives it back when the queue is full.
    pub fn push(&mut self, pdu: QueuedPdu) -> Result<(), QueuedPdu> {
        if self.q.len() >= self.cap {
            self.tally.refuse();
            return Err(pdu);
        }
        self.q.push_back(pdu);
        self.tally.push();
        Ok(())
    }

    pub fn pop(&mut self) -> Option<QueuedPdu> {
        let p = self.q.pop_front()?;
        self.tally.pop();
        Some(p)
    }

    pub fn len(&self) -> usize {
        self.q.len()
    }
}

/// SplitMix64: a tiny, seeded, deterministic generator for the draws of a
/// policy (QTA-Mux's skip probability). Not for anything cryptographic.
#[derive(Debug, Clone)]
pub(crate) struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Name of a C/U matrix cell in the papers' style: urgency as a letter
/// (0 = `A`, most urgent), cherish as a digit from 1 (0 = `1`, most
/// cherished). Seed 003's A1 is urgency 0, cherish 0.
pub(crate) fn cell_name(urgency: u8, cherish: u8) -> String {
    format!("{}{}", urgency_name(urgency), u32::from(cherish) + 1)
}

/// Name of an urgency level: `A`, `B`, … (`U26`, … past `Z`).
pub(crate) fn urgency_name(urgency: u8) -> String {
    if urgency < 26 {
        char::from(b'A' + urgency).to_string()
    } else {
        format!("U{urgency}")
    }
}
