//! The header every `rina-tgen` SDU starts with.
//!
//! All integers are big-endian; the header is [`HEADER_LEN`] = 28 bytes:
//!
//! | offset | size | field     | meaning                                                    |
//! |--------|------|-----------|------------------------------------------------------------|
//! | 0      | 4    | magic     | `RTG1`                                                     |
//! | 4      | 1    | kind      | see [`Kind`]                                               |
//! | 5      | 1    | flags     | 0 (reserved)                                               |
//! | 6      | 2    | reserved  | 0                                                          |
//! | 8      | 4    | flow      | flow id, chosen by the client, unique in its run           |
//! | 12     | 8    | seq       | DATA/PROBE: sequence number from 0 per flow and direction; FIN: SDUs sent |
//! | 20     | 8    | send_ns   | sender's `CLOCK_REALTIME` at write, ns since the Unix epoch (virtual time in the simulator); FIN: bytes sent |
//!
//! DATA SDUs are padded with zeros to the size the generator chose. After the
//! header, HELLO carries the JSON of a [`super::Hello`], REPORT the JSON of a
//! [`super::metrics::FlowReport`].

/// First bytes of every tgen SDU.
pub const MAGIC: [u8; 4] = *b"RTG1";
/// Bytes of the header; the smallest SDU the generator writes.
pub const HEADER_LEN: usize = 28;

/// What an SDU is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// Generated traffic; measured by the receiver.
    Data = 1,
    /// An RTT probe; the peer sends it back as [`Kind::ProbeReply`].
    Probe = 2,
    /// A probe sent back unchanged but for the kind.
    ProbeReply = 3,
    /// The sender of a direction is done: `seq` = SDUs sent, `send_ns` = bytes sent.
    Fin = 4,
    /// Client to server, first SDU of a flow: what to generate back (JSON body).
    Hello = 5,
    /// Server to client, answer to FIN: what the server received (JSON body).
    Report = 6,
}

impl Kind {
    fn from_u8(b: u8) -> Option<Kind> {
        Some(match b {
            1 => Kind::Data,
            2 => Kind::Probe,
            3 => Kind::ProbeReply,
            4 => Kind::Fin,
            5 => Kind::Hello,
            6 => Kind::Report,
            _ => return None,
        })
    }
}

/// A decoded header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// What the SDU is.
    pub kind: Kind,
    /// Flow id.
    pub flow: u32,
    /// Sequence number (FIN: SDUs sent).
    pub seq: u64,
    /// Send time in ns (FIN: bytes sent).
    pub send_ns: u64,
}

impl Header {
    /// A DATA header.
    pub fn data(flow: u32, seq: u64, send_ns: u64) -> Header {
        Header {
            kind: Kind::Data,
            flow,
            seq,
            send_ns,
        }
    }

    /// Writes the header at the start of `buf`; false if `buf` is too short.
    pub fn write(&self, buf: &mut [u8]) -> bool {
        let Some(h) = buf.get_mut(..HEADER_LEN) else {
            return false;
        };
        h[..4].copy_from_slice(&MAGIC);
        h[4] = self.kind as u8;
        h[5..8].fill(0);
        h[8..12].copy_from_slice(&self.flow.to_be_bytes());
        h[12..20].copy_from_slice(&self.seq.to_be_bytes());
        h[20..28].copy_from_slice(&self.send_ns.to_be_bytes());
        true
    }

    /// The header followed by `body`.
    pub fn encode_with(&self, body: &[u8]) -> Vec<u8> {
        let mut v = vec![0u8; HEADER_LEN + body.len()];
        self.write(&mut v);
        v[HEADER_LEN..].copy_from_slice(body);
        v
    }

    /// Decodes the header of `b`; `None` if it is not a tgen SDU.
    pub fn decode(b: &[u8]) -> Option<Header> {
        let h = b.get(..HEADER_LEN)?;
        if h[..4] != MAGIC {
            return None;
        }
        Some(Header {
            kind: Kind::from_u8(h[4])?,
            flow: u32::from_be_bytes(h[8..12].try_into().ok()?),
            seq: u64::from_be_bytes(h[12..20].try_into().ok()?),
            send_ns: u64::from_be_bytes(h[20..28].try_into().ok()?),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let h = Header::data(7, 123_456_789_012, 1_700_000_000_123_456_789);
        let mut buf = vec![0xffu8; 100];
        assert!(h.write(&mut buf));
        assert_eq!(Header::decode(&buf), Some(h));
        assert!(!h.write(&mut [0u8; 27]));
        assert_eq!(Header::decode(&buf[..27]), None);
        buf[0] = b'X';
        assert_eq!(Header::decode(&buf), None);
        let r = Header {
            kind: Kind::Report,
            ..h
        }
        .encode_with(b"{}");
        assert_eq!(&r[HEADER_LEN..], b"{}");
        assert_eq!(Header::decode(&r).unwrap().kind, Kind::Report);
    }
}
