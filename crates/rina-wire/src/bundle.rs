//! Frames of a flow bundle: many flows of one application carried over
//! one descriptor between it and `rinad` (a `SOCK_SEQPACKET` socket, one
//! packet per frame), instead of a descriptor per flow.
//!
//! A process may hold only so many descriptors (this machine's containers:
//! 20,000, not raisable); a bundle holds tens of thousands of flows in
//! one, on both sides. Every frame starts with an 8-byte header:
//!
//! ```text
//!  0      1      4                8
//!  +------+------+----------------+----------------
//!  | kind | zero | port-id (LE32) | SDU (kind 0 only)
//!  +------+------+----------------+----------------
//! ```
//!
//! * kind 0, [`Kind::Sdu`]: one SDU of flow `port`, either way;
//! * kind 1, [`Kind::End`]: from the application, it closes flow `port`
//!   (as closing a flow's own descriptor does); from the daemon, flow
//!   `port` ended (its peer deallocated it, after every SDU it sent
//!   came in this bundle), and the port is no longer the application's.
//!
//! The frames of one flow keep their order; the flows of a bundle share
//! its socket, so an application that does not read holds up all of
//! them, and the daemon holds what is written on flows whose windows are
//! closed only up to a bound (`rinad`'s `HELD_BACK_MAX`), past which the
//! others' writes wait behind them (as the streams of one TCP connection
//! do).

/// Bytes of the header in front of every frame.
pub const HEADER: usize = 8;
/// Largest SDU a frame carries: the largest a normal DIF carries.
pub const MAX_SDU: usize = 65_536;

/// What a frame says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// An SDU of the flow.
    Sdu = 0,
    /// The flow is closed (by the application) or ended (by its peer).
    End = 1,
}

/// A frame, parsed: a view of the packet it came in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame<'a> {
    pub kind: Kind,
    pub port: u32,
    /// The SDU (empty for [`Kind::End`]).
    pub payload: &'a [u8],
}

/// Why a packet is not a frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// Shorter than the header.
    #[error("bundle frame of {0} bytes is shorter than its {HEADER}-byte header")]
    Short(usize),
    /// The kind byte is neither 0 (SDU) nor 1 (end).
    #[error("bundle frame of unknown kind {0} (0: SDU, 1: end)")]
    UnknownKind(u8),
    /// The reserved bytes are not zero.
    #[error("bundle frame with reserved bytes {0:02x?} not zero")]
    Reserved([u8; 3]),
    /// An end frame carries bytes after its header.
    #[error("bundle end frame for port {port} carries {len} bytes after its header")]
    EndWithData { port: u32, len: usize },
}

/// The header of a frame of `kind` for flow `port`.
pub fn header(kind: Kind, port: u32) -> [u8; HEADER] {
    let p = port.to_le_bytes();
    [kind as u8, 0, 0, 0, p[0], p[1], p[2], p[3]]
}

/// Parses one packet of a bundle.
pub fn parse(pkt: &[u8]) -> Result<Frame<'_>, FrameError> {
    let Some((h, payload)) = pkt.split_first_chunk::<HEADER>() else {
        return Err(FrameError::Short(pkt.len()));
    };
    let kind = match h[0] {
        0 => Kind::Sdu,
        1 => Kind::End,
        k => return Err(FrameError::UnknownKind(k)),
    };
    if h[1..4] != [0, 0, 0] {
        return Err(FrameError::Reserved([h[1], h[2], h[3]]));
    }
    let port = u32::from_le_bytes([h[4], h[5], h[6], h[7]]);
    if kind == Kind::End && !payload.is_empty() {
        return Err(FrameError::EndWithData {
            port,
            len: payload.len(),
        });
    }
    Ok(Frame {
        kind,
        port,
        payload,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_frame_reads_back_as_written() {
        let mut pkt = header(Kind::Sdu, 70_001).to_vec();
        pkt.extend_from_slice(b"hello");
        let f = parse(&pkt).unwrap();
        assert_eq!(
            (f.kind, f.port, f.payload),
            (Kind::Sdu, 70_001, &b"hello"[..])
        );
        let end = header(Kind::End, 7);
        assert_eq!(parse(&end).unwrap().kind, Kind::End);
        assert_eq!(parse(&header(Kind::Sdu, 1)).unwrap().payload, b"");
    }

    #[test]
    fn what_is_not_a_frame_says_why() {
        assert_eq!(parse(&[0; 7]), Err(FrameError::Short(7)));
        assert_eq!(
            parse(&[2, 0, 0, 0, 1, 0, 0, 0]),
            Err(FrameError::UnknownKind(2))
        );
        assert_eq!(
            parse(&[0, 0, 9, 0, 1, 0, 0, 0]),
            Err(FrameError::Reserved([0, 9, 0]))
        );
        let mut end = header(Kind::End, 3).to_vec();
        end.push(1);
        assert_eq!(
            parse(&end),
            Err(FrameError::EndWithData { port: 3, len: 1 })
        );
    }

    proptest! {
        #[test]
        fn no_packet_panics_the_parser(pkt in proptest::collection::vec(any::<u8>(), 0..32)) {
            if let Ok(f) = parse(&pkt) {
                prop_assert_eq!(f.payload.len() + HEADER, pkt.len());
            }
        }
    }
}
