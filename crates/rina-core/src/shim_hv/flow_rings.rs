//! Shared-memory rings between an application and the daemon for one flow
//! (the zero-system-call data path of flows over shim-hv and normal DIFs).
//!
//! An application asks for them when it allocates or accepts a flow; if
//! the IPCP serving the flow offers them, the daemon creates a memory file
//! (sealed against shrinking) and a pipe and sends them (of the pipe, the
//! read end), with a [`Setup`] message, as the first packet of the flow's
//! socket. The file holds two rings of [`super::ring`] one after the
//! other: first the daemon-to-application ring, then the
//! application-to-daemon ring, both of the geometry the setup message
//! gives. The same validation as between VMs applies: an application
//! writing garbage into the file only breaks its own flow.
//!
//! Notification: when the daemon published SDUs the application waits
//! for, it writes a one-byte packet on the flow socket (so the socket
//! turns readable, as a flow without rings does, and poll/epoll/tokio wait
//! on it unchanged); when it freed room the application waits for, it
//! writes a byte into the pipe. (It was an eventfd: its one open file,
//! shared, could be made blocking by the application, and the daemon then
//! blocked on it; the application's end of a pipe is its own. The
//! application reads either until it is empty.) The application tells the
//! daemon by writing a one-byte packet on the flow socket too. Each side
//! only drains the packets it receives, and rings only when the ring
//! header says the other sleeps.

use super::ring::Geometry;

/// What a setup message starts with when rings follow (with two
/// descriptors: the memory file and the room pipe). Version 1 also
/// carried a data eventfd, where version 2 rings the flow socket.
pub const MAGIC_RINGS: &[u8; 8] = b"RINARNG2";
/// What a setup message is when the IPCP offers no rings: the flow is a
/// plain socket.
pub const MAGIC_NONE: &[u8; 8] = b"RINARNG0";
/// Length of a setup message with rings.
pub const SETUP_LEN: usize = 16;

/// The geometry of the rings the daemon makes: 16384 slots of 256 bytes
/// per direction (4 MiB, as the VMPI rings; a 1400-byte SDU takes 6 slots,
/// a 64 KiB SDU 257). The file is sparse: pages are only used once SDUs
/// went through them. Small slots pack small SDUs 16 to a page: with one
/// 4 KiB slot per SDU, every SDU of a new flow's first lap touched a fresh
/// page, and the page faults made a round trip through two daemons 25 %
/// longer with rings than with sockets. Both producers restart at the
/// first slot when they find their ring empty
/// ([`Producer::set_restarts`](super::ring::Producer::set_restarts)), so a
/// flow whose reader keeps up uses an eighth of its ring, not all of it.
pub const GEOMETRY: Geometry = Geometry {
    slot_size: 256,
    slots: 16384,
};

/// Bytes of its send ring an application fills at most by default (a
/// quarter of it): the ring is the flow's send buffer, and a whole ring in
/// front of a slow flow is seconds of data queued before it. Three reliable
/// flows sharing 10 Mb/s each had 3,300 SDUs of 1,200 bytes waiting in
/// their rings, 9.5 s at their share; with this limit 2.4 s. A flow whose
/// daemon keeps up uses an eighth of the ring, below the limit
/// ([`crate::shim_hv::ring::Producer::set_limit`]).
pub const SEND_LIMIT: usize = 1 << 20;

/// The first packet of a flow's socket when the application asked for rings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Setup {
    /// Rings of this geometry follow in the memory file.
    Rings(Geometry),
    /// No rings: read and write the socket.
    None,
}

impl Setup {
    /// Its bytes.
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Setup::Rings(g) => {
                let mut v = MAGIC_RINGS.to_vec();
                v.extend_from_slice(&g.slot_size.to_le_bytes());
                v.extend_from_slice(&g.slots.to_le_bytes());
                v
            }
            Setup::None => MAGIC_NONE.to_vec(),
        }
    }

    /// Parses a setup message; `None` if it is not one (or its geometry is
    /// unusable).
    pub fn decode(b: &[u8]) -> Option<Setup> {
        if b == MAGIC_NONE {
            return Some(Setup::None);
        }
        if b.len() != SETUP_LEN || &b[..8] != MAGIC_RINGS {
            return None;
        }
        let u = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let g = Geometry {
            slot_size: u(8),
            slots: u(12),
        };
        g.validate().ok().map(Setup::Rings)
    }
}

/// Offset of the daemon-to-application ring, offset of the
/// application-to-daemon ring, and the size of the file.
pub fn layout(geo: Geometry) -> (usize, usize, usize) {
    let r = geo.ring_bytes();
    (0, r, 2 * r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn setup_round_trips_and_refuses_garbage() {
        for s in [Setup::Rings(GEOMETRY), Setup::None] {
            assert_eq!(Setup::decode(&s.encode()), Some(s));
        }
        let mut bad = Setup::Rings(GEOMETRY).encode();
        bad[12] = 3; // 3 slots: not a power of two
        assert_eq!(Setup::decode(&bad), None);
        assert_eq!(Setup::decode(b"hello"), None);
        assert_eq!(Setup::decode(&[]), None);
        let (a, b, total) = layout(GEOMETRY);
        assert_eq!((a, b), (0, GEOMETRY.ring_bytes()));
        assert_eq!(total, 2 * GEOMETRY.ring_bytes());
    }
}
