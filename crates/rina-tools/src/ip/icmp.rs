//! The ICMP errors the tunnel writes to its TUN, as a router would:
//!
//! * "too big", for a packet it cannot send because it is larger than the
//!   flow's largest SDU: IPv4's "fragmentation needed and DF set" (type 3,
//!   code 4, RFC 1191) and ICMPv6's "packet too big" (type 2, RFC 4443),
//!   carrying the MTU the packet must fit, so that the sender's path-MTU
//!   discovery sends smaller packets instead of losing every large one
//!   without a word;
//! * "no route", for a packet to an address no peer's prefix covers (one
//!   of the TUN's own subnet, say): IPv4's "net unreachable" (type 3, code
//!   0) and ICMPv6's "no route to destination" (type 1, code 0), so that
//!   the sender fails at once instead of waiting out its timeouts;
//! * "unreachable", for a packet to an address a peer's prefix covers
//!   while no flow to that peer is up (it is being allocated again):
//!   IPv4's "host unreachable" (type 3, code 1) and ICMPv6's "address
//!   unreachable" (type 1, code 3), for the same reason.
//!
//! Each carries the start of the packet. The error comes from the packet's
//! destination address: the tunnel has no address of its own on the path,
//! and one of the host's own addresses as source would be dropped by the
//! kernel as a martian.

use std::net::{Ipv4Addr, Ipv6Addr};

/// ICMPv6 errors quote the packet up to IPv6's minimum MTU (1280 bytes in
/// all, RFC 4443 2.4 c).
pub const V6_QUOTE: usize = 1280 - 40 - 8;

/// How many of a packet's first bytes the errors quote at most (give them
/// that many when there are).
pub const MAX_QUOTE: usize = V6_QUOTE;

/// The ICMP error telling the sender of the packet whose first bytes are
/// `head` that it must fit `mtu` bytes, ready to write to the TUN; `None`
/// where none is due: an IPv4 packet that may be fragmented (DF clear), or
/// as for [`no_route`].
pub fn too_big(head: &[u8], mtu: u32) -> Option<Vec<u8>> {
    match head.first()? >> 4 {
        4 => {
            // DF clear: a router would fragment it, not answer.
            if head.len() < 20 || head[6] & 0x40 == 0 {
                return None;
            }
            let next_hop_mtu = u16::try_from(mtu).unwrap_or(u16::MAX).to_be_bytes();
            error_v4(head, 3, 4, [0, 0, next_hop_mtu[0], next_hop_mtu[1]])
        }
        6 => error_v6(head, 2, 0, mtu.to_be_bytes()),
        _ => None,
    }
}

/// The ICMP error telling the sender of the packet whose first bytes are
/// `head` that there is no route to its destination; `None` where none
/// is due: a later fragment, an ICMP error (never answered with another),
/// a sender or destination that cannot be one end of the error
/// (unspecified, multicast, broadcast), or bytes that are not an IP
/// header.
pub fn no_route(head: &[u8]) -> Option<Vec<u8>> {
    match head.first()? >> 4 {
        4 => error_v4(head, 3, 0, [0; 4]),
        6 => error_v6(head, 1, 0, [0; 4]),
        _ => None,
    }
}

/// The ICMP error telling the sender of the packet whose first bytes are
/// `head` that its destination cannot be reached now (the peer that
/// covers it has no flow up); `None` where none is due, as for
/// [`no_route`].
pub fn unreachable(head: &[u8]) -> Option<Vec<u8>> {
    match head.first()? >> 4 {
        4 => error_v4(head, 3, 1, [0; 4]),
        6 => error_v6(head, 1, 3, [0; 4]),
        _ => None,
    }
}

/// An ICMP error of `kind` and `code` (the second word `word`) about the
/// IPv4 packet whose first bytes are `head`, if one is due.
fn error_v4(head: &[u8], kind: u8, code: u8, word: [u8; 4]) -> Option<Vec<u8>> {
    if head.len() < 20 {
        return None;
    }
    let ihl = usize::from(head[0] & 0x0f) * 4;
    if ihl < 20 || head.len() < ihl {
        return None;
    }
    let frag_offset = u16::from_be_bytes([head[6] & 0x1f, head[7]]);
    if frag_offset != 0 {
        return None;
    }
    let src = Ipv4Addr::new(head[12], head[13], head[14], head[15]);
    let dst = Ipv4Addr::new(head[16], head[17], head[18], head[19]);
    let unusable = |a: Ipv4Addr| a.is_unspecified() || a.is_multicast() || a.is_broadcast();
    if unusable(src) || unusable(dst) {
        return None;
    }
    // ICMP error types: unreachable, source quench, redirect, time
    // exceeded, parameter problem.
    if head[9] == 1 && head.get(ihl).is_some_and(|t| [3, 4, 5, 11, 12].contains(t)) {
        return None;
    }
    let quote = &head[..(ihl + 8).min(head.len())];
    let total = 20 + 8 + quote.len();
    let mut p = Vec::with_capacity(total);
    // Header: version 4, IHL 5, precedence "internetwork control" as the
    // kernel's own ICMP errors; TTL 64; protocol 1 (ICMP).
    p.extend_from_slice(&[0x45, 0xc0]);
    p.extend_from_slice(&(total as u16).to_be_bytes());
    p.extend_from_slice(&[0, 0, 0, 0, 64, 1, 0, 0]);
    p.extend_from_slice(&dst.octets());
    p.extend_from_slice(&src.octets());
    let c = checksum(&[&p[..20]]);
    p[10..12].copy_from_slice(&c.to_be_bytes());
    p.extend_from_slice(&[kind, code, 0, 0]);
    p.extend_from_slice(&word);
    p.extend_from_slice(quote);
    let c = checksum(&[&p[20..]]);
    p[22..24].copy_from_slice(&c.to_be_bytes());
    Some(p)
}

/// An ICMPv6 error of `kind` and `code` (the second word `word`) about the
/// IPv6 packet whose first bytes are `head`, if one is due.
fn error_v6(head: &[u8], kind: u8, code: u8, word: [u8; 4]) -> Option<Vec<u8>> {
    if head.len() < 40 {
        return None;
    }
    let octets = |at: usize| -> Ipv6Addr {
        let mut a = [0u8; 16];
        a.copy_from_slice(&head[at..at + 16]);
        Ipv6Addr::from(a)
    };
    let (src, dst) = (octets(8), octets(24));
    if src.is_unspecified() || src.is_multicast() || dst.is_unspecified() || dst.is_multicast() {
        return None;
    }
    // An ICMPv6 error (types below 128) is never answered with another.
    if head[6] == 58 && head.get(40).is_some_and(|&t| t < 128) {
        return None;
    }
    let quote = &head[..head.len().min(V6_QUOTE)];
    let plen = 8 + quote.len();
    let mut p = Vec::with_capacity(40 + plen);
    p.extend_from_slice(&[0x60, 0, 0, 0]);
    p.extend_from_slice(&(plen as u16).to_be_bytes());
    // Next header 58 (ICMPv6), hop limit 64.
    p.extend_from_slice(&[58, 64]);
    p.extend_from_slice(&dst.octets());
    p.extend_from_slice(&src.octets());
    p.extend_from_slice(&[kind, code, 0, 0]);
    p.extend_from_slice(&word);
    p.extend_from_slice(quote);
    let pseudo_len = (plen as u32).to_be_bytes();
    let c = checksum(&[&p[8..40], &pseudo_len, &[0, 0, 0, 58], &p[40..]]);
    p[42..44].copy_from_slice(&c.to_be_bytes());
    Some(p)
}

/// The Internet checksum (RFC 1071) of the concatenation of `parts`, each
/// of an even length but the last.
fn checksum(parts: &[&[u8]]) -> u16 {
    let mut sum: u32 = 0;
    for part in parts {
        for c in part.chunks(2) {
            sum += u32::from(u16::from_be_bytes([c[0], c.get(1).copied().unwrap_or(0)]));
        }
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ip::packet::tests::{v4, v6};
    use crate::ip::packet::IpPacket;
    use std::net::IpAddr;

    /// A packet with DF set (as path-MTU discovery sends them).
    fn v4_df(proto: u8, payload: &[u8]) -> Vec<u8> {
        let mut p = v4([10, 0, 0, 1], [10, 0, 0, 2], 0, payload);
        p[6] = 0x40;
        p[9] = proto;
        p
    }

    proptest::proptest! {
        #[test]
        fn any_bytes_get_a_well_formed_error_or_none(
            b in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..1400),
            mtu in proptest::prelude::any::<u32>(),
        ) {
            for e in [too_big(&b, mtu), no_route(&b), unreachable(&b)].into_iter().flatten() {
                let ip = IpPacket::parse(&e).expect("the error is an IP packet");
                proptest::prop_assert_eq!(ip.bytes().len(), e.len());
                if e[0] >> 4 == 4 {
                    proptest::prop_assert_eq!(checksum(&[&e[..20]]), 0);
                    proptest::prop_assert_eq!(checksum(&[&e[20..]]), 0);
                } else {
                    let plen = ((e.len() - 40) as u32).to_be_bytes();
                    proptest::prop_assert_eq!(
                        checksum(&[&e[8..40], &plen, &[0, 0, 0, 58], &e[40..]]),
                        0
                    );
                    proptest::prop_assert!(e.len() <= 1280);
                }
            }
        }
    }

    #[test]
    fn an_ipv4_packet_with_df_gets_fragmentation_needed() {
        let orig = v4_df(17, &[7u8; 100]);
        let e = too_big(&orig, 1400).expect("an ICMP error");
        let ip = IpPacket::parse(&e).unwrap();
        assert_eq!(ip.src(), "10.0.0.2".parse::<IpAddr>().unwrap());
        assert_eq!(ip.dst(), "10.0.0.1".parse::<IpAddr>().unwrap());
        assert_eq!(e[9], 1, "protocol ICMP");
        assert_eq!(checksum(&[&e[..20]]), 0, "header checksum");
        assert_eq!(checksum(&[&e[20..]]), 0, "ICMP checksum");
        assert_eq!((e[20], e[21]), (3, 4), "type 3 code 4");
        assert_eq!(u16::from_be_bytes([e[26], e[27]]), 1400);
        // The header and 8 bytes of the packet are quoted.
        assert_eq!(&e[28..], &orig[..28]);
    }

    #[test]
    fn no_error_is_due_for_some_packets() {
        // DF clear: a router would fragment it.
        assert_eq!(
            too_big(&v4([10, 0, 0, 1], [10, 0, 0, 2], 0, &[0; 50]), 1400),
            None
        );
        // A later fragment.
        let mut p = v4_df(17, &[0; 50]);
        p[7] = 1;
        assert_eq!(too_big(&p, 1400), None);
        // An ICMP error (destination unreachable) vs. an echo request.
        assert_eq!(too_big(&v4_df(1, &[3, 4, 0, 0, 0, 0, 0, 0]), 1400), None);
        assert!(too_big(&v4_df(1, &[8, 0, 0, 0, 0, 0, 0, 0]), 1400).is_some());
        // From nobody, to a group.
        let mut p = v4_df(17, &[0; 50]);
        p[12..16].copy_from_slice(&[0, 0, 0, 0]);
        assert_eq!(too_big(&p, 1400), None);
        let mut p = v4_df(17, &[0; 50]);
        p[16] = 239;
        assert_eq!(too_big(&p, 1400), None);
        // Not IP, or too short for a header.
        assert_eq!(too_big(&[], 1400), None);
        assert_eq!(too_big(&[0x45; 10], 1400), None);
        assert_eq!(too_big(&[0x60; 30], 1400), None);
        assert_eq!(too_big(&[0x10; 60], 1400), None);
    }

    #[test]
    fn a_packet_with_no_route_gets_unreachable_df_or_not() {
        let orig = v4([10, 0, 0, 1], [10, 0, 0, 9], 0, &[5u8; 40]);
        let e = no_route(&orig).expect("an ICMP error");
        assert_eq!((e[20], e[21]), (3, 0), "type 3 code 0");
        assert_eq!(checksum(&[&e[..20]]), 0);
        assert_eq!(checksum(&[&e[20..]]), 0);
        assert_eq!(&e[16..20], &[10, 0, 0, 1]);
        assert_eq!(&e[28..], &orig[..28]);
        let (s, d): (Ipv6Addr, Ipv6Addr) = ("fd00::1".parse().unwrap(), "fd00::9".parse().unwrap());
        let e = no_route(&v6(s, d, 0, &[1; 20])).expect("an ICMPv6 error");
        assert_eq!((e[40], e[41]), (1, 0), "type 1 code 0");
        let plen = ((e.len() - 40) as u32).to_be_bytes();
        assert_eq!(checksum(&[&e[8..40], &plen, &[0, 0, 0, 58], &e[40..]]), 0);
        // Not to an ICMP error.
        assert_eq!(no_route(&v4_df(1, &[11, 0, 0, 0, 0, 0, 0, 0])), None);
    }

    #[test]
    fn a_packet_for_a_peer_without_a_flow_gets_host_unreachable() {
        let orig = v4([10, 0, 0, 1], [10, 0, 0, 9], 0, &[5u8; 40]);
        let e = unreachable(&orig).expect("an ICMP error");
        assert_eq!((e[20], e[21]), (3, 1), "type 3 code 1");
        assert_eq!(checksum(&[&e[..20]]), 0);
        assert_eq!(checksum(&[&e[20..]]), 0);
        assert_eq!(
            (&e[12..16], &e[16..20]),
            (&[10, 0, 0, 9][..], &[10, 0, 0, 1][..])
        );
        assert_eq!(&e[28..], &orig[..28]);
        let (s, d): (Ipv6Addr, Ipv6Addr) = ("fd00::1".parse().unwrap(), "fd00::9".parse().unwrap());
        let e = unreachable(&v6(s, d, 0, &[1; 20])).expect("an ICMPv6 error");
        assert_eq!((e[40], e[41]), (1, 3), "type 1 code 3");
        let plen = ((e.len() - 40) as u32).to_be_bytes();
        assert_eq!(checksum(&[&e[8..40], &plen, &[0, 0, 0, 58], &e[40..]]), 0);
        // Never about an ICMP error, nor a later fragment.
        assert_eq!(unreachable(&v4_df(1, &[3, 1, 0, 0, 0, 0, 0, 0])), None);
        let mut p = v4_df(17, &[0; 50]);
        p[7] = 3;
        assert_eq!(unreachable(&p), None);
    }

    #[test]
    fn an_ipv6_packet_gets_packet_too_big() {
        let (s, d): (Ipv6Addr, Ipv6Addr) = ("fd00::1".parse().unwrap(), "fd00::2".parse().unwrap());
        let orig = v6(s, d, 0, &[9u8; 3000]);
        let e = too_big(&orig, 1500).expect("an ICMPv6 error");
        assert_eq!(e.len(), 1280, "quoted up to the minimum MTU");
        let ip = IpPacket::parse(&e).unwrap();
        assert_eq!((ip.src(), ip.dst()), (IpAddr::V6(d), IpAddr::V6(s)));
        assert_eq!(e[6], 58);
        assert_eq!((e[40], e[41]), (2, 0), "type 2 code 0");
        assert_eq!(u32::from_be_bytes([e[44], e[45], e[46], e[47]]), 1500);
        let plen = ((e.len() - 40) as u32).to_be_bytes();
        assert_eq!(
            checksum(&[&e[8..40], &plen, &[0, 0, 0, 58], &e[40..]]),
            0,
            "ICMPv6 checksum"
        );
        assert_eq!(&e[48..], &orig[..V6_QUOTE]);
        // Not in answer to an ICMPv6 error; to an echo request, yes.
        let mut err = v6(s, d, 0, &[1, 0, 0, 0]);
        err[6] = 58;
        assert_eq!(too_big(&err, 1500), None);
        err[40] = 128;
        assert!(too_big(&err, 1500).is_some());
        assert_eq!(too_big(&v6(Ipv6Addr::UNSPECIFIED, d, 0, &[]), 1500), None);
    }
}
