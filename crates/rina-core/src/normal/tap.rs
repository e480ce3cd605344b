//! Copies of the frames a normal IPCP sends and receives on its N-1 ports,
//! kept for a capture ([`NormalIpcp::set_tap`](super::NormalIpcp::set_tap)).
//!
//! The frames are the PDUs as they travel on the N-1 flows (SDU protection
//! applied: the TTL byte, the PCI, the payload, the CRC when configured),
//! the same bytes a shim below carries in one SDU — so a capture of a
//! normal IPCP stacked on another normal IPCP or on a shim for
//! hypervisors, which nothing else can see, decodes like a capture of the
//! wire. The queue is bounded: a driver that does not poll loses the
//! newest copies (counted), never the frames themselves.

use super::N1Port;
use crate::time::Instant;
use std::collections::VecDeque;

/// A copy of one frame on an N-1 port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tapped {
    /// When the IPCP saw it.
    pub at: Instant,
    /// Sent (true) or received (false).
    pub outbound: bool,
    /// The N-1 port it was sent or received on.
    pub port: N1Port,
    /// The frame.
    pub frame: Vec<u8>,
}

/// The bounded queue of copies.
#[derive(Debug)]
pub(super) struct Tap {
    limit: usize,
    frames: VecDeque<Tapped>,
    dropped: u64,
}

impl Tap {
    pub(super) fn new(limit: usize) -> Tap {
        Tap {
            limit: limit.max(1),
            frames: VecDeque::new(),
            dropped: 0,
        }
    }

    pub(super) fn record(&mut self, at: Instant, outbound: bool, port: N1Port, frame: &[u8]) {
        if self.frames.len() >= self.limit {
            self.dropped += 1;
            return;
        }
        self.frames.push_back(Tapped {
            at,
            outbound,
            port,
            frame: frame.to_vec(),
        });
    }

    pub(super) fn pop(&mut self) -> Option<Tapped> {
        self.frames.pop_front()
    }

    pub(super) fn dropped(&self) -> u64 {
        self.dropped
    }
}
