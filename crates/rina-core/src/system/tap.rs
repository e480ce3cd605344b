//! Copies of what a shim IPCP sends and receives on its medium, kept for a
//! capture ([`System::set_medium_tap`]).
//!
//! The copies are taken where the system hands frames to the driver and
//! takes them from it: every [`Output::ToMedium`](super::Output::ToMedium)
//! (control messages, ARP, frames of normal IPCPs above, SDUs of
//! application flows written through [`System::write`]), every header and
//! SDU accounted by [`System::shim_send`], and every frame given to
//! [`System::receive`] (before the shim parses it, so garbage is captured
//! too). What a driver moves without the system — SDUs of application
//! flows on a shim-hv going ring to ring — it reports with
//! [`System::tap_moved`] while [`System::medium_tapped`] says so.
//!
//! The queue of each medium is bounded (in copies, and in bytes by
//! [`TAP_MAX_BYTES`]): a driver that does not poll
//! ([`System::poll_medium_tapped`]) loses the newest copies (counted,
//! [`System::medium_tap_dropped`]), never the frames themselves.

use super::{MediumId, System};
use crate::time::Instant;
use std::collections::VecDeque;
use std::net::SocketAddr;

/// Bytes of copies one medium keeps at most until polled.
pub const TAP_MAX_BYTES: usize = 16 << 20;

/// A copy of one frame of a shim's medium.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MediumTapped {
    /// When the system saw it.
    pub at: Instant,
    /// Sent (true) or received (false).
    pub outbound: bool,
    /// The UDP peer it went to or came from (shim-udp).
    pub peer: Option<SocketAddr>,
    /// The VLAN tag the kernel stripped from a received Ethernet frame
    /// (shim-eth), which is not in [`MediumTapped::frame`].
    pub aux_vlan: Option<u16>,
    /// The frame: a UDP datagram's payload, an Ethernet frame, a VMPI
    /// buffer with its channel header.
    pub frame: Vec<u8>,
}

/// The bounded queue of copies of one medium.
#[derive(Debug)]
pub(super) struct MediumTap {
    limit: usize,
    frames: VecDeque<MediumTapped>,
    bytes: usize,
    dropped: u64,
}

impl MediumTap {
    fn new(limit: usize) -> MediumTap {
        MediumTap {
            limit: limit.max(1),
            frames: VecDeque::new(),
            bytes: 0,
            dropped: 0,
        }
    }

    fn full(&self, len: usize) -> bool {
        self.frames.len() >= self.limit || self.bytes + len > TAP_MAX_BYTES
    }

    fn pop(&mut self) -> Option<MediumTapped> {
        let t = self.frames.pop_front()?;
        self.bytes -= t.frame.len();
        Some(t)
    }
}

impl System {
    /// From now on (`limit` given), keeps a copy of every frame shim
    /// `medium` sends and receives, at most `limit` of them until polled
    /// ([`System::poll_medium_tapped`]); `None` stops and forgets them.
    pub fn set_medium_tap(&mut self, medium: MediumId, limit: Option<usize>) {
        match limit {
            Some(l) => {
                self.taps.insert(medium, MediumTap::new(l));
            }
            None => {
                self.taps.remove(&medium);
            }
        }
    }

    /// The oldest copy kept for medium `medium`.
    pub fn poll_medium_tapped(&mut self, medium: MediumId) -> Option<MediumTapped> {
        self.taps.get_mut(&medium)?.pop()
    }

    /// Copies of medium `medium` lost because the queue was full.
    pub fn medium_tap_dropped(&self, medium: MediumId) -> u64 {
        self.taps.get(&medium).map_or(0, |t| t.dropped)
    }

    /// Whether medium `medium` is tapped (a driver that moves frames
    /// without the system then reports them, [`System::tap_moved`]).
    pub fn medium_tapped(&self, medium: MediumId) -> bool {
        self.taps.contains_key(&medium)
    }

    /// A frame the driver of shim `medium` moved without the system (SDUs
    /// of application flows on a shim-hv, ring to ring), for its tap.
    pub fn tap_moved(&mut self, medium: MediumId, outbound: bool, frame: Vec<u8>) {
        if !self.taps.contains_key(&medium) {
            return;
        }
        self.tap(medium, outbound, None, None, &[&frame]);
    }

    /// Keeps a copy of `parts` (concatenated) if medium `medium` is tapped.
    pub(super) fn tap(
        &mut self,
        medium: MediumId,
        outbound: bool,
        peer: Option<SocketAddr>,
        aux_vlan: Option<u16>,
        parts: &[&[u8]],
    ) {
        if self.taps.is_empty() {
            return;
        }
        let at = self.now;
        let Some(t) = self.taps.get_mut(&medium) else {
            return;
        };
        let len = parts.iter().map(|p| p.len()).sum();
        if t.full(len) {
            t.dropped += 1;
            return;
        }
        t.bytes += len;
        t.frames.push_back(MediumTapped {
            at,
            outbound,
            peer,
            aux_vlan,
            frame: parts.concat(),
        });
    }

    /// Queues `frame` for medium `medium` (a copy kept if it is tapped).
    pub(super) fn send_on_medium(
        &mut self,
        medium: MediumId,
        peer: Option<SocketAddr>,
        frame: crate::buf::PduBuf,
    ) {
        self.tap(medium, true, peer, None, &[&frame]);
        self.out.push_back(super::Output::ToMedium {
            medium,
            peer,
            frame,
        });
    }
}
