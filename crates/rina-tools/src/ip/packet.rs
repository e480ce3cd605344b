//! What travels on a tunnel flow: IP packets as they are, and `rina-ip`'s own
//! control frames (keepalives), told apart by the first byte.
//!
//! An SDU whose first nibble is 4 or 6 is an IP packet; one whose first byte
//! is 0 is a control frame `[0, kind, ...]`. Anything else is not for us and
//! is counted and dropped by the caller. [`Frame::parse`] checks lengths
//! before anything is read, so it cannot panic on any input.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use thiserror::Error;

/// Kind byte of a keepalive control frame.
const KIND_KEEPALIVE: u8 = 1;

/// The keepalive frame each side sends on every flow so that the other side
/// notices a flow that silently died (the daemon at the far end restarted).
pub const KEEPALIVE: [u8; 3] = [0, KIND_KEEPALIVE, 1];

/// Why an SDU (from a flow) or a packet (from the TUN) was not forwarded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum PacketError {
    /// The SDU is empty.
    #[error("empty packet")]
    Empty,
    /// The first nibble is neither 4 nor 6, and it is not a control frame.
    #[error("not an IP packet (version nibble {0})")]
    NotIp(u8),
    /// Shorter than the fixed IP header.
    #[error("IPv{version} packet of {len} bytes is shorter than its header")]
    Truncated {
        /// 4 or 6.
        version: u8,
        /// Bytes received.
        len: usize,
    },
    /// The header's length fields disagree with the bytes received.
    #[error("IPv{version} header says {claimed} bytes, {len} received")]
    BadLength {
        /// 4 or 6.
        version: u8,
        /// What the header claims (total length, or 40 + payload length).
        claimed: usize,
        /// Bytes received.
        len: usize,
    },
    /// A control frame of a kind this version does not know.
    #[error("unknown control frame kind {0}")]
    UnknownControl(u8),
}

/// A checked IPv4 or IPv6 packet: its header lengths are consistent with the
/// bytes, so every accessor reads inside the slice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpPacket<'a> {
    bytes: &'a [u8],
}

impl<'a> IpPacket<'a> {
    /// Checks `b` as an IP packet. Bytes after the length the header claims
    /// are cut off.
    pub fn parse(b: &'a [u8]) -> Result<IpPacket<'a>, PacketError> {
        let first = *b.first().ok_or(PacketError::Empty)?;
        match first >> 4 {
            4 => {
                if b.len() < 20 {
                    return Err(PacketError::Truncated {
                        version: 4,
                        len: b.len(),
                    });
                }
                let ihl = usize::from(first & 0x0f) * 4;
                let total = usize::from(u16::from_be_bytes([b[2], b[3]]));
                if ihl < 20 || total < ihl || total > b.len() {
                    return Err(PacketError::BadLength {
                        version: 4,
                        claimed: total,
                        len: b.len(),
                    });
                }
                Ok(IpPacket { bytes: &b[..total] })
            }
            6 => {
                if b.len() < 40 {
                    return Err(PacketError::Truncated {
                        version: 6,
                        len: b.len(),
                    });
                }
                let total = 40 + usize::from(u16::from_be_bytes([b[4], b[5]]));
                if total > b.len() {
                    return Err(PacketError::BadLength {
                        version: 6,
                        claimed: total,
                        len: b.len(),
                    });
                }
                Ok(IpPacket { bytes: &b[..total] })
            }
            v => Err(PacketError::NotIp(v)),
        }
    }

    /// 4 or 6.
    pub fn version(&self) -> u8 {
        self.bytes[0] >> 4
    }

    /// The packet's bytes (up to the length its header claims).
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// Source address.
    pub fn src(&self) -> IpAddr {
        self.addr(12, 8)
    }

    /// Destination address.
    pub fn dst(&self) -> IpAddr {
        self.addr(16, 24)
    }

    fn addr(&self, v4_at: usize, v6_at: usize) -> IpAddr {
        let b = self.bytes;
        if self.version() == 4 {
            let mut a = [0u8; 4];
            a.copy_from_slice(&b[v4_at..v4_at + 4]);
            IpAddr::V4(Ipv4Addr::from(a))
        } else {
            let mut a = [0u8; 16];
            a.copy_from_slice(&b[v6_at..v6_at + 16]);
            IpAddr::V6(Ipv6Addr::from(a))
        }
    }

    /// The DSCP: the top six bits of the IPv4 TOS or the IPv6 traffic class.
    pub fn dscp(&self) -> u8 {
        let b = self.bytes;
        if self.version() == 4 {
            b[1] >> 2
        } else {
            let tc = ((b[0] & 0x0f) << 4) | (b[1] >> 4);
            tc >> 2
        }
    }
}

/// One SDU received on a tunnel flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Frame<'a> {
    /// An IP packet for the TUN.
    Ip(IpPacket<'a>),
    /// The peer is alive.
    Keepalive,
}

impl<'a> Frame<'a> {
    /// Classifies an SDU.
    pub fn parse(b: &'a [u8]) -> Result<Frame<'a>, PacketError> {
        match b.first() {
            None => Err(PacketError::Empty),
            Some(0) => match b.get(1) {
                Some(&KIND_KEEPALIVE) => Ok(Frame::Keepalive),
                Some(&k) => Err(PacketError::UnknownControl(k)),
                None => Err(PacketError::UnknownControl(0)),
            },
            Some(_) => IpPacket::parse(b).map(Frame::Ip),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A minimal IPv4 packet from `src` to `dst` with `payload` and TOS `tos`.
    pub fn v4(src: [u8; 4], dst: [u8; 4], tos: u8, payload: &[u8]) -> Vec<u8> {
        let total = (20 + payload.len()) as u16;
        let mut p = vec![0x45, tos];
        p.extend_from_slice(&total.to_be_bytes());
        p.extend_from_slice(&[0, 0, 0, 0, 64, 17, 0, 0]);
        p.extend_from_slice(&src);
        p.extend_from_slice(&dst);
        p.extend_from_slice(payload);
        p
    }

    /// A minimal IPv6 packet with traffic class `tc`.
    pub fn v6(src: Ipv6Addr, dst: Ipv6Addr, tc: u8, payload: &[u8]) -> Vec<u8> {
        let mut p = vec![0x60 | (tc >> 4), tc << 4, 0, 0];
        p.extend_from_slice(&(payload.len() as u16).to_be_bytes());
        p.extend_from_slice(&[17, 64]);
        p.extend_from_slice(&src.octets());
        p.extend_from_slice(&dst.octets());
        p.extend_from_slice(payload);
        p
    }

    #[test]
    fn ipv4_fields_are_read() {
        let p = v4([10, 0, 0, 1], [10, 0, 0, 2], 46 << 2, b"hello");
        let ip = IpPacket::parse(&p).unwrap();
        assert_eq!(ip.version(), 4);
        assert_eq!(ip.src(), "10.0.0.1".parse::<IpAddr>().unwrap());
        assert_eq!(ip.dst(), "10.0.0.2".parse::<IpAddr>().unwrap());
        assert_eq!(ip.dscp(), 46);
        assert_eq!(ip.bytes().len(), 25);
    }

    #[test]
    fn ipv6_fields_are_read() {
        let (s, d): (Ipv6Addr, Ipv6Addr) = ("fd00::1".parse().unwrap(), "fd00::2".parse().unwrap());
        let p = v6(s, d, 10 << 2, b"abc");
        let ip = IpPacket::parse(&p).unwrap();
        assert_eq!(ip.version(), 6);
        assert_eq!(ip.src(), IpAddr::V6(s));
        assert_eq!(ip.dst(), IpAddr::V6(d));
        assert_eq!(ip.dscp(), 10);
    }

    #[test]
    fn bad_packets_are_refused_with_reasons() {
        assert_eq!(IpPacket::parse(&[]), Err(PacketError::Empty));
        assert_eq!(IpPacket::parse(&[0x50; 40]), Err(PacketError::NotIp(5)));
        assert!(matches!(
            IpPacket::parse(&[0x45; 10]),
            Err(PacketError::Truncated { version: 4, .. })
        ));
        let mut p = v4([1, 1, 1, 1], [2, 2, 2, 2], 0, b"xy");
        p[3] += 1; // claims one byte more than there is
        assert!(matches!(
            IpPacket::parse(&p),
            Err(PacketError::BadLength { version: 4, .. })
        ));
        let mut p = v4([1, 1, 1, 1], [2, 2, 2, 2], 0, b"");
        p[0] = 0x44; // header length 16 < 20
        assert!(IpPacket::parse(&p).is_err());
        let mut p = v6(Ipv6Addr::LOCALHOST, Ipv6Addr::LOCALHOST, 0, b"xy");
        p[5] = 3;
        assert!(matches!(
            IpPacket::parse(&p),
            Err(PacketError::BadLength { version: 6, .. })
        ));
        // Trailing bytes beyond the claimed length are cut off.
        let mut p = v4([1, 1, 1, 1], [2, 2, 2, 2], 0, b"xy");
        p.extend_from_slice(b"junk");
        assert_eq!(IpPacket::parse(&p).unwrap().bytes().len(), 22);
    }

    #[test]
    fn frames_are_told_apart() {
        assert_eq!(Frame::parse(&KEEPALIVE), Ok(Frame::Keepalive));
        assert_eq!(Frame::parse(&[0, 9]), Err(PacketError::UnknownControl(9)));
        assert_eq!(Frame::parse(&[0]), Err(PacketError::UnknownControl(0)));
        let p = v4([1, 1, 1, 1], [2, 2, 2, 2], 0, b"");
        assert!(matches!(Frame::parse(&p), Ok(Frame::Ip(_))));
        assert_eq!(Frame::parse(b"\x80abc"), Err(PacketError::NotIp(8)));
        assert!(matches!(
            Frame::parse(b"GET /"),
            Err(PacketError::Truncated { version: 4, len: 5 })
        ));
    }

    proptest! {
        #[test]
        fn any_bytes_parse_without_panicking(b in proptest::collection::vec(any::<u8>(), 0..200)) {
            if let Ok(Frame::Ip(ip)) = Frame::parse(&b) {
                prop_assert!(ip.bytes().len() <= b.len());
                let _ = (ip.src(), ip.dst(), ip.dscp());
            }
        }
    }
}
