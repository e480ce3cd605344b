//! Frames of the shim DIF over Ethernet (IEEE 802.1Q).
//!
//! A data frame is Ethernet II with an 802.1Q tag whose VLAN id is the shim
//! DIF's name, EtherType [`ETH_P_RINA`] (0xD1F0) and exactly one SDU as
//! payload. In untagged mode (a plain segment) the tag is left out.
//!
//! ```text
//! | dst MAC (6) | src MAC (6) | 0x8100 | PCP/DEI/VID (2) | 0xD1F0 | SDU ... |
//! ```
//!
//! Names are resolved with RFC 826 ARP on EtherType [`ETH_P_ARP`] (0x0806)
//! in the same VLAN: hardware type 1 (Ethernet), protocol type 0xD1F0,
//! protocol addresses = application names as text. Both protocol addresses
//! of a packet have the length of the longer name; the shorter one is padded
//! with zero bytes, which are stripped on receipt.
//!
//! [`Frame::parse`] and [`Arp::parse`] never panic: anything short or
//! malformed is a [`WireError`].

use crate::codec::{Reader, WireError};
use std::fmt;
use std::str::FromStr;

/// EtherType of shim-DIF data frames (not officially registered).
pub const ETH_P_RINA: u16 = 0xD1F0;
/// EtherType of ARP.
pub const ETH_P_ARP: u16 = 0x0806;
/// EtherType (TPID) of an 802.1Q tag.
pub const ETH_P_8021Q: u16 = 0x8100;
/// Bytes of an Ethernet II header without a tag.
pub const ETH_HEADER_LEN: usize = 14;
/// Bytes an 802.1Q tag adds.
pub const VLAN_TAG_LEN: usize = 4;
/// Largest valid VLAN id (4095 is reserved).
pub const MAX_VLAN: u16 = 4094;
/// ARP hardware type of Ethernet.
pub const ARP_HTYPE_ETHERNET: u16 = 1;
/// Bytes of the fixed part of an ARP packet (before the addresses).
pub const ARP_FIXED_LEN: usize = 8;
/// ARP operation: request.
pub const ARP_REQUEST: u16 = 1;
/// ARP operation: reply.
pub const ARP_REPLY: u16 = 2;

/// A 48-bit MAC address.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    /// The broadcast address `ff:ff:ff:ff:ff:ff`.
    pub const BROADCAST: MacAddr = MacAddr([0xff; 6]);
    /// The all-zero address (an unknown target in an ARP request).
    pub const ZERO: MacAddr = MacAddr([0; 6]);

    /// Whether this is a group (multicast or broadcast) address.
    pub fn is_group(&self) -> bool {
        self.0[0] & 1 == 1
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            m[0], m[1], m[2], m[3], m[4], m[5]
        )
    }
}

impl fmt::Debug for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl FromStr for MacAddr {
    type Err = WireError;

    /// Parses `aa:bb:cc:dd:ee:ff` (or with `-`): six parts of exactly two
    /// hex digits each (no sign, no white space).
    fn from_str(s: &str) -> Result<Self, WireError> {
        let bad = || WireError::BadValue {
            field: "mac",
            value: s.len() as u64,
        };
        let mut m = [0u8; 6];
        let mut parts = s.split([':', '-']);
        for b in &mut m {
            let p = parts.next().ok_or_else(bad)?;
            if p.len() != 2 || !p.bytes().all(|c| c.is_ascii_hexdigit()) {
                return Err(bad());
            }
            *b = u8::from_str_radix(p, 16).map_err(|_| bad())?;
        }
        if parts.next().is_some() {
            return Err(bad());
        }
        Ok(MacAddr(m))
    }
}

/// The link-layer header of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    /// Destination MAC.
    pub dst: MacAddr,
    /// Source MAC.
    pub src: MacAddr,
    /// VLAN id of the 802.1Q tag, `None` when untagged.
    pub vlan: Option<u16>,
    /// EtherType of the payload (after the tag, if any).
    pub ethertype: u16,
}

impl FrameHeader {
    /// Bytes this header takes on the wire.
    pub fn len(&self) -> usize {
        ETH_HEADER_LEN + if self.vlan.is_some() { VLAN_TAG_LEN } else { 0 }
    }

    /// Always false: a header is never empty (for clippy's `len` rule).
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Writes the header at the start of `out` and returns its length, or
    /// `None` if `out` is too short. The VLAN id is masked to 12 bits; PCP
    /// and DEI are 0.
    pub fn write(&self, out: &mut [u8]) -> Option<usize> {
        let n = self.len();
        let out = out.get_mut(..n)?;
        out[0..6].copy_from_slice(&self.dst.0);
        out[6..12].copy_from_slice(&self.src.0);
        let mut at = 12;
        if let Some(vid) = self.vlan {
            out[12..14].copy_from_slice(&ETH_P_8021Q.to_be_bytes());
            out[14..16].copy_from_slice(&(vid & 0x0fff).to_be_bytes());
            at = 16;
        }
        out[at..at + 2].copy_from_slice(&self.ethertype.to_be_bytes());
        Some(n)
    }

    /// The header as bytes.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.len()];
        let _ = self.write(&mut v);
        v
    }
}

/// A parsed frame, borrowing its payload from the receive buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame<'a> {
    /// The link-layer header.
    pub header: FrameHeader,
    /// Everything after the header.
    pub payload: &'a [u8],
}

impl<'a> Frame<'a> {
    /// Parses a frame as read from an `AF_PACKET` socket (no preamble, no
    /// FCS). One 802.1Q tag is understood; a second (QinQ) one stays in the
    /// EtherType (0x8100) and payload. Never panics.
    pub fn parse(buf: &'a [u8]) -> Result<Self, WireError> {
        let mut r = Reader::new(buf);
        let dst = MacAddr(r.bytes(6)?.try_into().unwrap_or_default());
        let src = MacAddr(r.bytes(6)?.try_into().unwrap_or_default());
        let mut ethertype = r.u16()?;
        let mut vlan = None;
        if ethertype == ETH_P_8021Q {
            vlan = Some(r.u16()? & 0x0fff);
            ethertype = r.u16()?;
        }
        Ok(Frame {
            header: FrameHeader {
                dst,
                src,
                vlan,
                ethertype,
            },
            payload: r.rest(),
        })
    }

    /// The whole frame as bytes.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = self.header.to_vec();
        v.extend_from_slice(self.payload);
        v
    }
}

/// An ARP operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArpOp {
    /// Who has `tpa`? Tell `spa` at `sha`.
    Request,
    /// `spa` is at `sha`.
    Reply,
}

/// An ARP packet of the shim DIF (protocol type 0xD1F0), borrowing its
/// protocol addresses (application names as bytes, zero padding removed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arp<'a> {
    /// Request or reply.
    pub op: ArpOp,
    /// Sender hardware address.
    pub sha: MacAddr,
    /// Sender protocol address: the sender's application name.
    pub spa: &'a [u8],
    /// Target hardware address (zero in a request).
    pub tha: MacAddr,
    /// Target protocol address: the name looked for / the requester's name.
    pub tpa: &'a [u8],
}

/// `b` without trailing zero bytes.
fn unpad(b: &[u8]) -> &[u8] {
    let end = b.iter().rposition(|&c| c != 0).map_or(0, |i| i + 1);
    &b[..end]
}

impl<'a> Arp<'a> {
    /// Parses the payload of an ARP frame. Refuses other hardware or
    /// protocol types, lengths other than 6 for MACs, empty protocol
    /// addresses and unknown operations. Bytes after the packet (Ethernet
    /// padding of short frames) are ignored. Never panics.
    pub fn parse(buf: &'a [u8]) -> Result<Self, WireError> {
        let mut r = Reader::new(buf);
        let htype = r.u16()?;
        if htype != ARP_HTYPE_ETHERNET {
            return Err(WireError::BadValue {
                field: "arp.htype",
                value: htype as u64,
            });
        }
        let ptype = r.u16()?;
        if ptype != ETH_P_RINA {
            return Err(WireError::BadValue {
                field: "arp.ptype",
                value: ptype as u64,
            });
        }
        let hlen = r.u8()?;
        if hlen != 6 {
            return Err(WireError::BadValue {
                field: "arp.hlen",
                value: hlen as u64,
            });
        }
        let plen = r.u8()? as usize;
        if plen == 0 {
            return Err(WireError::BadValue {
                field: "arp.plen",
                value: 0,
            });
        }
        let op = match r.u16()? {
            ARP_REQUEST => ArpOp::Request,
            ARP_REPLY => ArpOp::Reply,
            v => {
                return Err(WireError::BadValue {
                    field: "arp.oper",
                    value: v as u64,
                })
            }
        };
        let sha = MacAddr(r.bytes(6)?.try_into().unwrap_or_default());
        let spa = unpad(r.bytes(plen)?);
        let tha = MacAddr(r.bytes(6)?.try_into().unwrap_or_default());
        let tpa = unpad(r.bytes(plen)?);
        if spa.is_empty() || tpa.is_empty() {
            return Err(WireError::BadValue {
                field: "arp.pa",
                value: 0,
            });
        }
        Ok(Arp {
            op,
            sha,
            spa,
            tha,
            tpa,
        })
    }

    /// Bytes the encoded packet takes.
    pub fn len(&self) -> usize {
        ARP_FIXED_LEN + 2 * (6 + self.spa.len().max(self.tpa.len()))
    }

    /// Always false: an ARP packet is never empty (for clippy's `len` rule).
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Appends the encoded packet to `out`. Fails if a protocol address is
    /// empty or longer than 255 bytes (the one-byte `plen` field).
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), WireError> {
        let plen = self.spa.len().max(self.tpa.len());
        if plen > 255 {
            return Err(WireError::FieldOverflow {
                field: "arp.plen",
                value: plen as u64,
                width: 1,
            });
        }
        if self.spa.is_empty() || self.tpa.is_empty() {
            return Err(WireError::BadValue {
                field: "arp.pa",
                value: 0,
            });
        }
        out.extend_from_slice(&ARP_HTYPE_ETHERNET.to_be_bytes());
        out.extend_from_slice(&ETH_P_RINA.to_be_bytes());
        out.push(6);
        out.push(plen as u8);
        let op = match self.op {
            ArpOp::Request => ARP_REQUEST,
            ArpOp::Reply => ARP_REPLY,
        };
        out.extend_from_slice(&op.to_be_bytes());
        for (ha, pa) in [(self.sha, self.spa), (self.tha, self.tpa)] {
            out.extend_from_slice(&ha.0);
            out.extend_from_slice(pa);
            out.resize(out.len() + plen - pa.len(), 0);
        }
        Ok(())
    }

    /// A whole ARP frame with header `hdr` (whose EtherType is set to
    /// [`ETH_P_ARP`]).
    pub fn to_frame(&self, hdr: FrameHeader) -> Result<Vec<u8>, WireError> {
        let hdr = FrameHeader {
            ethertype: ETH_P_ARP,
            ..hdr
        };
        let mut v = hdr.to_vec();
        self.encode(&mut v)?;
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const A: MacAddr = MacAddr([2, 0, 0, 0, 0, 1]);
    const B: MacAddr = MacAddr([2, 0, 0, 0, 0, 2]);

    #[test]
    fn tagged_data_frame_layout() {
        let h = FrameHeader {
            dst: B,
            src: A,
            vlan: Some(10),
            ethertype: ETH_P_RINA,
        };
        let f = Frame {
            header: h,
            payload: b"sdu",
        }
        .to_vec();
        assert_eq!(
            f,
            [
                2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x81, 0x00, 0x00, 0x0a, 0xd1, 0xf0, b's', b'd',
                b'u'
            ]
        );
        let p = Frame::parse(&f).unwrap();
        assert_eq!(p.header, h);
        assert_eq!(p.payload, b"sdu");
    }

    #[test]
    fn untagged_frame_and_pcp_bits() {
        let h = FrameHeader {
            dst: MacAddr::BROADCAST,
            src: A,
            vlan: None,
            ethertype: ETH_P_ARP,
        };
        assert_eq!(h.len(), ETH_HEADER_LEN);
        let v = h.to_vec();
        assert_eq!(&v[12..], &[0x08, 0x06]);
        // A tag with priority 5 and DEI set still names VLAN 20.
        let mut t = FrameHeader {
            vlan: Some(20),
            ..h
        }
        .to_vec();
        t[14] |= 0xb0;
        assert_eq!(Frame::parse(&t).unwrap().header.vlan, Some(20));
        assert!(matches!(
            Frame::parse(&v[..13]),
            Err(WireError::Truncated { .. })
        ));
        assert!(matches!(
            Frame::parse(&t[..15]),
            Err(WireError::Truncated { .. })
        ));
    }

    #[test]
    fn arp_pads_the_shorter_name_and_strips_it() {
        let req = Arp {
            op: ArpOp::Request,
            sha: A,
            spa: b"a.net",
            tha: MacAddr::ZERO,
            tpa: b"server.net/1",
        };
        let mut v = Vec::new();
        req.encode(&mut v).unwrap();
        assert_eq!(v.len(), req.len());
        assert_eq!(&v[..8], &[0, 1, 0xd1, 0xf0, 6, 12, 0, 1]);
        assert_eq!(&v[14..26], b"a.net\0\0\0\0\0\0\0");
        assert_eq!(&v[32..44], b"server.net/1");
        assert_eq!(Arp::parse(&v).unwrap(), req);
        // Ethernet padding after the packet is ignored.
        v.extend_from_slice(&[0; 10]);
        assert_eq!(Arp::parse(&v).unwrap(), req);
    }

    #[test]
    fn arp_refuses_foreign_packets() {
        let mut v = Vec::new();
        Arp {
            op: ArpOp::Reply,
            sha: A,
            spa: b"x",
            tha: B,
            tpa: b"y",
        }
        .encode(&mut v)
        .unwrap();
        let mut ipv4 = v.clone();
        ipv4[2..4].copy_from_slice(&[0x08, 0x00]);
        assert!(matches!(
            Arp::parse(&ipv4),
            Err(WireError::BadValue {
                field: "arp.ptype",
                ..
            })
        ));
        let mut op = v.clone();
        op[7] = 9;
        assert!(Arp::parse(&op).is_err());
        let mut empty = v.clone();
        empty[14] = 0;
        assert!(Arp::parse(&empty).is_err());
        assert!(Arp::parse(&v[..v.len() - 1]).is_err());
        let long = [b'n'; 256];
        let a = Arp {
            op: ArpOp::Request,
            sha: A,
            spa: &long,
            tha: B,
            tpa: b"y",
        };
        assert!(a.encode(&mut Vec::new()).is_err());
    }

    #[test]
    fn mac_text() {
        let m: MacAddr = "02:00:0a:ff:00:01".parse().unwrap();
        assert_eq!(m.0, [2, 0, 10, 255, 0, 1]);
        assert_eq!(m.to_string(), "02:00:0a:ff:00:01");
        assert!("02:00:0a:ff:00".parse::<MacAddr>().is_err());
        assert!("02:00:0a:ff:00:01:02".parse::<MacAddr>().is_err());
        assert!("zz:00:0a:ff:00:01".parse::<MacAddr>().is_err());
        assert!(MacAddr::BROADCAST.is_group() && !A.is_group());
    }

    #[test]
    fn mac_parts_are_two_hex_digits() {
        // u8::from_str_radix alone would take a sign.
        assert!("+1:+2:+3:+4:+5:+6".parse::<MacAddr>().is_err());
        assert!("02:00:0a:ff:00:+1".parse::<MacAddr>().is_err());
        assert!("02-00-0a-ff-00-+f".parse::<MacAddr>().is_err());
        assert!(" 2:00:0a:ff:00:01".parse::<MacAddr>().is_err());
        let m: MacAddr = "0A-0b-Cc-dD-00-FF".parse().unwrap();
        assert_eq!(m.0, [0x0a, 0x0b, 0xcc, 0xdd, 0x00, 0xff]);
    }

    proptest! {
        #[test]
        fn parsers_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            if let Ok(f) = Frame::parse(&bytes) {
                let _ = Arp::parse(f.payload);
            }
            let _ = Arp::parse(&bytes);
        }

        #[test]
        fn arp_round_trip(spa in "[a-z./]{1,40}", tpa in "[a-z./]{1,40}", op in any::<bool>()) {
            let a = Arp {
                op: if op { ArpOp::Request } else { ArpOp::Reply },
                sha: A,
                spa: spa.as_bytes(),
                tha: B,
                tpa: tpa.as_bytes(),
            };
            let f = a.to_frame(FrameHeader { dst: B, src: A, vlan: Some(7), ethertype: 0 }).unwrap();
            let p = Frame::parse(&f).unwrap();
            prop_assert_eq!(p.header.ethertype, ETH_P_ARP);
            prop_assert_eq!(Arp::parse(p.payload).unwrap(), a);
        }

        #[test]
        fn frame_round_trip(vlan in proptest::option::of(0u16..4096), et in any::<u16>(),
                            payload in proptest::collection::vec(any::<u8>(), 0..100)) {
            prop_assume!(et != ETH_P_8021Q);
            let h = FrameHeader { dst: B, src: A, vlan, ethertype: et };
            let v = Frame { header: h, payload: &payload }.to_vec();
            let p = Frame::parse(&v).unwrap();
            prop_assert_eq!(p.header, h);
            prop_assert_eq!(p.payload, &payload[..]);
        }
    }
}
