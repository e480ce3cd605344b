//! What travels on a tunnel flow: IP packets as they are, and `rina-ip`'s own
//! frames (keepalives, packets whose checksum is left to the far end), told
//! apart by the first byte.
//!
//! An SDU whose first nibble is 4 or 6 is an IP packet; one whose first byte
//! is 0 is a control frame `[0, kind, ...]`:
//!
//! * `[0, 1, 1]`: a keepalive;
//! * `[0, 2, start: u16, offset: u16, packet...]` (big-endian): an IP packet
//!   whose TCP or UDP checksum is *partial*, as the kernel hands it to a TUN
//!   with checksum offload (virtio's `NEEDS_CSUM`): the field at
//!   `start + offset` holds the pseudo-header's sum, and the sum of the bytes
//!   from `start` on is still to be added. The far end gives the packet to
//!   its TUN with the same offsets, so no side computes a checksum that a
//!   local socket would never check; a packet forwarded on to a real
//!   interface is completed by the kernel or the NIC there. A far end
//!   without offload completes it itself ([`complete_checksum`]).
//!
//! Anything else is not for us and is counted and dropped by the caller.
//! [`Frame::parse`] checks lengths before anything is read, so it cannot
//! panic on any input.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use thiserror::Error;

/// Kind byte of a keepalive control frame.
const KIND_KEEPALIVE: u8 = 1;

/// The keepalive frame each side sends on every flow so that the other side
/// notices a flow that silently died (the daemon at the far end restarted).
pub const KEEPALIVE: [u8; 3] = [0, KIND_KEEPALIVE, 1];

/// Kind byte of a frame carrying a packet with a partial checksum.
const KIND_PARTIAL_CSUM: u8 = 2;

/// Bytes in front of the packet in a partial-checksum frame.
pub const PARTIAL_HEADER: usize = 6;

/// Where a partial checksum is to be completed: the sum runs from `start`
/// (bytes from the IP header's first) to the end of the packet and is
/// stored at `start + offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartialCsum {
    /// First byte summed.
    pub start: u16,
    /// Where the 16-bit checksum is, from `start`.
    pub offset: u16,
}

impl PartialCsum {
    /// The frame header `[0, 2, start, offset]` that goes in front of the packet.
    pub fn header(self) -> [u8; PARTIAL_HEADER] {
        let [s0, s1] = self.start.to_be_bytes();
        let [o0, o1] = self.offset.to_be_bytes();
        [0, KIND_PARTIAL_CSUM, s0, s1, o0, o1]
    }

    /// Whether the checksum field and the bytes summed lie inside a packet
    /// of `len` bytes, past the fixed IP header of `version`.
    pub fn fits(self, version: u8, len: usize) -> bool {
        let min_start = if version == 4 { 20 } else { 40 };
        let (start, field) = (usize::from(self.start), usize::from(self.offset));
        start >= min_start && start + field + 2 <= len
    }
}

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
    /// A control frame shorter than the header of its kind.
    #[error("control frame of {0} bytes is shorter than its header")]
    ShortControl(usize),
    /// A partial-checksum frame whose offsets point outside its packet.
    #[error("partial checksum at {start}+{offset} lies outside the {len}-byte packet")]
    BadChecksumOffsets {
        /// First byte summed.
        start: u16,
        /// Where the field is, from `start`.
        offset: u16,
        /// The packet's length.
        len: usize,
    },
}

/// A checked IPv4 or IPv6 packet: its header lengths are consistent with the
/// bytes, so every accessor reads inside the slice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpPacket<'a> {
    bytes: &'a [u8],
}

/// Bytes of a packet's beginning that hold every header field the tunnel
/// reads (the IPv6 header, or a partial-checksum frame and an IPv4 header
/// with options).
pub const HEAD: usize = 72;

/// The whole length an IP packet of `len` bytes claims in its header,
/// checked against `len`; `head` holds the packet's first bytes (at least
/// the first [`HEAD`], or all of them).
fn claimed_len(head: &[u8], len: usize) -> Result<usize, PacketError> {
    let first = *head.first().ok_or(PacketError::Empty)?;
    match first >> 4 {
        4 => {
            if len < 20 || head.len() < 20 {
                return Err(PacketError::Truncated { version: 4, len });
            }
            let ihl = usize::from(first & 0x0f) * 4;
            let total = usize::from(u16::from_be_bytes([head[2], head[3]]));
            if ihl < 20 || total < ihl || total > len {
                return Err(PacketError::BadLength {
                    version: 4,
                    claimed: total,
                    len,
                });
            }
            Ok(total)
        }
        6 => {
            if len < 40 || head.len() < 40 {
                return Err(PacketError::Truncated { version: 6, len });
            }
            let total = 40 + usize::from(u16::from_be_bytes([head[4], head[5]]));
            if total > len {
                return Err(PacketError::BadLength {
                    version: 6,
                    claimed: total,
                    len,
                });
            }
            Ok(total)
        }
        v => Err(PacketError::NotIp(v)),
    }
}

/// Whether the IP packet whose first bytes are `head` (at least its fixed
/// header) is longer than the `n` bytes read of it: a read into room too
/// small for it, which the TUN cuts to the room, keeping the rest.
pub fn cut(head: &[u8], n: usize) -> bool {
    claimed_len(head, usize::MAX).is_ok_and(|total| total > n)
}

/// The source address of the IP packet an SDU from a flow carries, read
/// from the SDU's first bytes `head` (at least [`HEAD`] of them, or all):
/// IPv4 bytes 12..16 or IPv6 bytes 8..24 of the packet, which follows the
/// [`PARTIAL_HEADER`] of a partial-checksum frame. `None` for a keepalive,
/// anything not IP, or a head too short to hold the address. Only the
/// version nibble is looked at: the caller checks the packet
/// ([`Shape::parse`]). Cannot panic.
pub fn source(head: &[u8]) -> Option<IpAddr> {
    let ip = match head {
        [0, KIND_PARTIAL_CSUM, ..] => head.get(PARTIAL_HEADER..)?,
        _ => head,
    };
    match ip.first()? >> 4 {
        4 => {
            let a: [u8; 4] = ip.get(12..16)?.try_into().ok()?;
            Some(IpAddr::V4(Ipv4Addr::from(a)))
        }
        6 => {
            let a: [u8; 16] = ip.get(8..24)?.try_into().ok()?;
            Some(IpAddr::V6(Ipv6Addr::from(a)))
        }
        _ => None,
    }
}

impl<'a> IpPacket<'a> {
    /// Checks `b` as an IP packet. Bytes after the length the header claims
    /// are cut off.
    pub fn parse(b: &'a [u8]) -> Result<IpPacket<'a>, PacketError> {
        let total = claimed_len(b, b.len())?;
        Ok(IpPacket { bytes: &b[..total] })
    }

    /// Checks the header of a packet of `len` bytes of which `head` holds
    /// the first (at least [`HEAD`] of them, or all), the rest lying
    /// elsewhere (in a flow's ring): the same checks as
    /// [`IpPacket::parse`], and the length the header claims. The packet
    /// returned has only the bytes at hand, so its header fields are right
    /// and [`IpPacket::bytes`] is not the whole packet.
    pub fn parse_head(head: &'a [u8], len: usize) -> Result<(IpPacket<'a>, usize), PacketError> {
        let total = claimed_len(head, len)?;
        Ok((
            IpPacket {
                bytes: &head[..total.min(head.len())],
            },
            total,
        ))
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
    /// An IP packet whose TCP/UDP checksum is still to be completed.
    Partial(IpPacket<'a>, PartialCsum),
    /// The peer is alive.
    Keepalive,
}

/// What an SDU received on a tunnel flow holds, from its first bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// An IP packet of `len` bytes at the SDU's start.
    Ip {
        /// The packet's length, as its header claims.
        len: usize,
    },
    /// An IP packet of `len` bytes after [`PARTIAL_HEADER`], its checksum
    /// still to be completed.
    Partial {
        /// The packet's length, as its header claims.
        len: usize,
        /// Where the checksum is to be completed.
        csum: PartialCsum,
    },
    /// A keepalive.
    Keepalive,
}

impl Shape {
    /// What an SDU of `len` bytes holds, of which `head` has the first (at
    /// least [`HEAD`] of them, or all).
    pub fn parse(head: &[u8], len: usize) -> Result<Shape, PacketError> {
        match head.first() {
            None => Err(PacketError::Empty),
            Some(0) => match head.get(1) {
                Some(&KIND_KEEPALIVE) => Ok(Shape::Keepalive),
                Some(&KIND_PARTIAL_CSUM) => {
                    let (Some(h), Some(rest)) =
                        (head.get(..PARTIAL_HEADER), head.get(PARTIAL_HEADER..))
                    else {
                        return Err(PacketError::ShortControl(len));
                    };
                    let csum = PartialCsum {
                        start: u16::from_be_bytes([h[2], h[3]]),
                        offset: u16::from_be_bytes([h[4], h[5]]),
                    };
                    let (ip, ip_len) =
                        IpPacket::parse_head(rest, len.saturating_sub(PARTIAL_HEADER))?;
                    if !csum.fits(ip.version(), ip_len) {
                        return Err(PacketError::BadChecksumOffsets {
                            start: csum.start,
                            offset: csum.offset,
                            len: ip_len,
                        });
                    }
                    Ok(Shape::Partial { len: ip_len, csum })
                }
                Some(&k) => Err(PacketError::UnknownControl(k)),
                None => Err(PacketError::UnknownControl(0)),
            },
            Some(_) => IpPacket::parse_head(head, len).map(|(_, len)| Shape::Ip { len }),
        }
    }
}

impl<'a> Frame<'a> {
    /// Classifies an SDU.
    pub fn parse(b: &'a [u8]) -> Result<Frame<'a>, PacketError> {
        Ok(match Shape::parse(b, b.len())? {
            Shape::Keepalive => Frame::Keepalive,
            Shape::Ip { len } => Frame::Ip(IpPacket { bytes: &b[..len] }),
            Shape::Partial { len, csum } => Frame::Partial(
                IpPacket {
                    bytes: &b[PARTIAL_HEADER..PARTIAL_HEADER + len],
                },
                csum,
            ),
        })
    }
}

/// Completes a partial checksum in place: adds the one's-complement sum of
/// `pkt[start..]` (the field included, which holds the pseudo-header's sum)
/// and stores its complement in the field. For a TUN without offload, to
/// which the kernel would otherwise hand a packet it cannot check. The
/// caller has checked the offsets ([`PartialCsum::fits`]); offsets outside
/// `pkt` leave it untouched.
pub fn complete_checksum(pkt: &mut [u8], csum: PartialCsum) {
    let start = usize::from(csum.start);
    let at = start + usize::from(csum.offset);
    if at + 2 > pkt.len() || start > pkt.len() {
        return;
    }
    let mut sum: u64 = 0;
    let mut chunks = pkt[start..].chunks_exact(8);
    for c in &mut chunks {
        let w = u64::from_be_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
        let (s, carry) = sum.overflowing_add(w);
        sum = s + u64::from(carry);
    }
    let mut tail = chunks.remainder().chunks(2);
    for c in &mut tail {
        let w = u16::from_be_bytes([c[0], c.get(1).copied().unwrap_or(0)]);
        let (s, carry) = sum.overflowing_add(u64::from(w));
        sum = s + u64::from(carry);
    }
    // Fold 64 -> 16 bits.
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    let mut c = !(sum as u16);
    if c == 0 && csum.offset == 6 {
        // UDP sends a zero checksum as all ones (zero means "none").
        c = 0xffff;
    }
    pkt[at..at + 2].copy_from_slice(&c.to_be_bytes());
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

    #[test]
    fn the_source_is_read_from_the_head_of_any_frame() {
        let v4p = v4([10, 203, 0, 7], [10, 203, 0, 2], 0, b"hi");
        let s6: Ipv6Addr = "fd23::7".parse().unwrap();
        let v6p = v6(s6, "fd23::2".parse().unwrap(), 0, b"hi");
        let ip4 = IpAddr::V4(Ipv4Addr::new(10, 203, 0, 7));
        assert_eq!(source(&v4p), Some(ip4));
        assert_eq!(source(&v6p), Some(IpAddr::V6(s6)));
        // Behind a partial-checksum frame's header.
        let csum = PartialCsum {
            start: 20,
            offset: 6,
        }
        .header();
        assert_eq!(source(&[&csum[..], &v4p].concat()), Some(ip4));
        assert_eq!(source(&[&csum[..], &v6p].concat()), Some(IpAddr::V6(s6)));
        // From a head of HEAD bytes of a longer packet.
        let long = v6(s6, s6, 0, &[7; 200]);
        assert_eq!(source(&long[..HEAD]), Some(IpAddr::V6(s6)));
        // Keepalives, anything not IP, and heads too short: none.
        for short in [
            &[][..],
            &KEEPALIVE,
            &[0, KIND_PARTIAL_CSUM, 0, 20, 0, 6],
            &[0, KIND_PARTIAL_CSUM, 0],
            &v4p[..15],
            &v6p[..23],
            &[&csum[..], &v4p[..15]].concat(),
            b"\x80 not ip at all, though long enough to hold one",
            b"\x00\x09 unknown control kind, long enough too",
        ] {
            assert_eq!(source(short), None, "{short:?}");
        }
        assert_eq!(source(&v4p[..16]), Some(ip4), "16 bytes hold it");
    }

    /// The one's-complement sum of `b` as 16-bit big-endian words, folded.
    fn sum16(b: &[u8]) -> u32 {
        let mut s: u32 = b
            .chunks(2)
            .map(|c| u32::from(u16::from_be_bytes([c[0], c.get(1).copied().unwrap_or(0)])))
            .sum();
        while s >> 16 != 0 {
            s = (s & 0xffff) + (s >> 16);
        }
        s
    }

    /// An IPv4 TCP (`proto` 6, checksum at 16) or UDP (17, at 6) packet
    /// with its checksum as the kernel hands it to an offloading TUN: the
    /// field holds the pseudo-header's sum, not complemented. Returns the
    /// packet and the checksum a full computation gives.
    fn partial_v4(proto: u8, payload: &[u8]) -> (Vec<u8>, PartialCsum, u16) {
        let l4_hdr = if proto == 6 { 20 } else { 8 };
        let field = if proto == 6 { 16 } else { 6 };
        let l4_len = l4_hdr + payload.len();
        let mut l4 = vec![0u8; l4_hdr];
        l4[..4].copy_from_slice(&[0x30, 0x39, 0x14, 0x51]); // ports
        if proto == 6 {
            l4[12] = 5 << 4; // data offset
        } else {
            l4[4..6].copy_from_slice(&(l4_len as u16).to_be_bytes());
        }
        l4.extend_from_slice(payload);
        let mut p = v4([10, 1, 2, 3], [10, 4, 5, 6], 0, &l4);
        p[9] = proto;
        let mut pseudo = p[12..20].to_vec();
        pseudo.extend_from_slice(&[0, proto]);
        pseudo.extend_from_slice(&(l4_len as u16).to_be_bytes());
        let full = {
            let mut all = pseudo.clone();
            all.extend_from_slice(&p[20..]);
            let c = !(sum16(&all) as u16);
            if c == 0 && proto == 17 {
                0xffff
            } else {
                c
            }
        };
        let at = 20 + field;
        p[at..at + 2].copy_from_slice(&(sum16(&pseudo) as u16).to_be_bytes());
        let csum = PartialCsum {
            start: 20,
            offset: field as u16,
        };
        (p, csum, full)
    }

    #[test]
    fn partial_checksum_frames_round_trip_and_offsets_are_checked() {
        let (p, csum, _) = partial_v4(6, b"some bytes of a segment");
        let mut f = csum.header().to_vec();
        f.extend_from_slice(&p);
        match Frame::parse(&f) {
            Ok(Frame::Partial(ip, c)) => {
                assert_eq!(c, csum);
                assert_eq!(ip.bytes(), &p[..]);
            }
            other => panic!("{other:?}"),
        }
        // The field must lie inside the packet, after the IP header.
        for (start, offset) in [
            (0, 16),
            (19, 0),
            (20, p.len() as u16 - 21),
            (u16::MAX, u16::MAX),
        ] {
            let mut f = PartialCsum { start, offset }.header().to_vec();
            f.extend_from_slice(&p);
            assert!(
                matches!(
                    Frame::parse(&f),
                    Err(PacketError::BadChecksumOffsets { .. })
                ),
                "{start}+{offset}"
            );
        }
        // A frame cut inside its header, or carrying no IP packet.
        assert_eq!(
            Frame::parse(&[0, 2, 0, 20]),
            Err(PacketError::ShortControl(4))
        );
        assert_eq!(Frame::parse(&[0, 2, 0, 20, 0, 16]), Err(PacketError::Empty));
        let mut v6p = PartialCsum {
            start: 20,
            offset: 6,
        }
        .header()
        .to_vec();
        v6p.extend_from_slice(&v6(Ipv6Addr::LOCALHOST, Ipv6Addr::LOCALHOST, 0, &[0; 8]));
        assert!(
            matches!(
                Frame::parse(&v6p),
                Err(PacketError::BadChecksumOffsets { .. })
            ),
            "an IPv6 packet's sum cannot start inside its 40-byte header"
        );
    }

    #[test]
    fn completing_a_partial_checksum_gives_the_full_one() {
        for (proto, payload) in [
            (6, &b"odd-length payload"[..]),
            (6, &b""[..]),
            (17, &b"even length!"[..]),
            (17, &[0xff; 3][..]),
        ] {
            let (mut p, csum, full) = partial_v4(proto, payload);
            complete_checksum(&mut p, csum);
            let at = 20 + usize::from(csum.offset);
            assert_eq!(
                u16::from_be_bytes([p[at], p[at + 1]]),
                full,
                "proto {proto}"
            );
        }
        // Offsets outside the packet leave it alone.
        let (mut p, _, _) = partial_v4(6, b"x");
        let before = p.clone();
        complete_checksum(
            &mut p,
            PartialCsum {
                start: 20,
                offset: 500,
            },
        );
        assert_eq!(p, before);
    }

    proptest! {
        #[test]
        fn any_bytes_parse_without_panicking(b in proptest::collection::vec(any::<u8>(), 0..200)) {
            let src = source(&b);
            if let Ok(Frame::Ip(ip)) = Frame::parse(&b) {
                prop_assert!(ip.bytes().len() <= b.len());
                let _ = (ip.src(), ip.dst(), ip.dscp());
                prop_assert_eq!(src, Some(ip.src()));
            }
            let mut partial = PartialCsum { start: 20, offset: 6 }.header().to_vec();
            partial.extend_from_slice(&b);
            let src = source(&partial);
            if let Ok(Frame::Partial(ip, c)) = Frame::parse(&partial) {
                prop_assert!(c.fits(ip.version(), ip.bytes().len()));
                prop_assert_eq!(src, Some(ip.src()));
            }
        }

        #[test]
        fn a_frame_read_from_its_first_bytes_is_the_frame_read_whole(
            mut b in proptest::collection::vec(any::<u8>(), 0..300),
            v6 in any::<bool>(),
            fix_len in any::<bool>(),
            partial in any::<bool>(),
            cut in 0usize..40,
        ) {
            // Most become IP packets whose header claims their length, or
            // a little less.
            if fix_len && b.len() >= 40 {
                if v6 {
                    b[0] = 0x60 | (b[0] & 0x0f);
                    let pl = (b.len() - 40 - cut.min(b.len() - 40)) as u16;
                    b[4..6].copy_from_slice(&pl.to_be_bytes());
                } else {
                    b[0] = 0x45;
                    let total = (b.len() - cut.min(b.len() - 20)) as u16;
                    b[2..4].copy_from_slice(&total.to_be_bytes());
                }
            }
            if let Ok((ip, len)) = IpPacket::parse_head(&b[..b.len().min(HEAD)], b.len()) {
                let whole = IpPacket::parse(&b).expect("the whole packet parses too");
                prop_assert_eq!(len, whole.bytes().len());
                prop_assert_eq!((ip.version(), ip.dst(), ip.dscp()), (whole.version(), whole.dst(), whole.dscp()));
            } else {
                prop_assert!(IpPacket::parse(&b).is_err());
            }
            let mut frame = Vec::new();
            if partial {
                frame.extend_from_slice(&PartialCsum { start: 20, offset: 6 }.header());
            }
            frame.extend_from_slice(&b);
            let whole = Frame::parse(&frame).map(|f| match f {
                Frame::Ip(p) => Shape::Ip { len: p.bytes().len() },
                Frame::Partial(p, csum) => Shape::Partial { len: p.bytes().len(), csum },
                Frame::Keepalive => Shape::Keepalive,
            });
            let head = Shape::parse(&frame[..frame.len().min(HEAD)], frame.len());
            prop_assert_eq!(whole, head);
            if let Ok(Shape::Ip { .. } | Shape::Partial { .. }) = head {
                let src = source(&frame[..frame.len().min(HEAD)]);
                prop_assert!(src.is_some());
                prop_assert_eq!(src, source(&frame));
            }
        }

        #[test]
        fn any_partial_checksum_completes_to_the_full_one(
            proto in prop_oneof![Just(6u8), Just(17u8)],
            payload in proptest::collection::vec(any::<u8>(), 0..3000),
        ) {
            let (mut p, csum, full) = partial_v4(proto, &payload);
            complete_checksum(&mut p, csum);
            let at = 20 + usize::from(csum.offset);
            prop_assert_eq!(u16::from_be_bytes([p[at], p[at + 1]]), full);
        }
    }
}
