//! The pcap format of `rinactl capture`: what an IPCP sends and receives,
//! for Wireshark and tshark. A classic pcap file (microsecond timestamps)
//! whose link type depends on the kind of IPCP:
//!
//! * a normal IPCP: [`LINKTYPE_RINA_N1`] (`LINKTYPE_USER0`, 147). Each
//!   packet is an [`N1_HEADER_LEN`]-byte pseudo-header — version (1),
//!   direction (0 received, 1 sent), two reserved zero bytes, the N-1
//!   port-id (4 bytes, network order) — and then the frame as it travelled
//!   on the N-1 flow (the SDU protection's TTL byte, the PCI, the payload,
//!   the CRC when the DIF has one);
//! * a shim-udp IPCP: [`LINKTYPE_RAW`] (101), each datagram behind the IPv4
//!   or IPv6 and UDP headers it had on the wire ([`ip_udp_header`]);
//! * a shim-eth IPCP: [`LINKTYPE_ETHERNET`] (1), the frames with their
//!   802.1Q tag ([`vlan_tagged`] puts back a tag the kernel stripped);
//! * a shim-hv IPCP: [`LINKTYPE_RINA_VMPI`] (`LINKTYPE_USER1`, 148): the
//!   same 8-byte pseudo-header as the N-1 frames but with the VMPI-id of
//!   the device in place of the port-id ([`vmpi_header`]), then the VMPI
//!   buffer (the 4-byte little-endian channel, the payload).
//!
//! `tools/wireshark/rina.lua` decodes them all.
//!
//! The daemon sends each packet as one record ([`record`]: record header
//! and data) on the capture's socket; `rinactl` writes [`file_header`]
//! first and then the records as they come.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

/// `LINKTYPE_USER0`: rinad's N-1 frames with their pseudo-header.
pub const LINKTYPE_RINA_N1: u32 = 147;
/// `LINKTYPE_RAW`: IPv4 or IPv6 packets (shim-udp's datagrams).
pub const LINKTYPE_RAW: u32 = 101;
/// `LINKTYPE_ETHERNET`: Ethernet frames (shim-eth).
pub const LINKTYPE_ETHERNET: u32 = 1;
/// `LINKTYPE_USER1`: VMPI buffers of a shim-hv with their pseudo-header.
pub const LINKTYPE_RINA_VMPI: u32 = 148;
/// Bytes of the pseudo-header in front of every frame.
pub const N1_HEADER_LEN: usize = 8;
/// Version of the pseudo-header.
pub const N1_HEADER_VERSION: u8 = 1;
/// Bytes of a record header.
pub const RECORD_HEADER_LEN: usize = 16;
/// Default and largest snapshot length.
pub const MAX_SNAPLEN: u32 = 65_535;

/// The 24-byte file header (little-endian magic 0xa1b2c3d4, version 2.4).
pub fn file_header(linktype: u32, snaplen: u32) -> [u8; 24] {
    let mut h = [0u8; 24];
    h[0..4].copy_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
    h[4..6].copy_from_slice(&2u16.to_le_bytes());
    h[6..8].copy_from_slice(&4u16.to_le_bytes());
    // thiszone and sigfigs stay zero.
    h[16..20].copy_from_slice(&snaplen.to_le_bytes());
    h[20..24].copy_from_slice(&linktype.to_le_bytes());
    h
}

/// The pseudo-header of a frame sent (`outbound`) or received on N-1 port
/// `port`.
pub fn n1_header(outbound: bool, port: u32) -> [u8; N1_HEADER_LEN] {
    let mut h = [0u8; N1_HEADER_LEN];
    h[0] = N1_HEADER_VERSION;
    h[1] = u8::from(outbound);
    h[4..8].copy_from_slice(&port.to_be_bytes());
    h
}

/// The pseudo-header of a VMPI buffer sent (`outbound`) or received on
/// the device with VMPI-id `vmpi_id`.
pub fn vmpi_header(outbound: bool, vmpi_id: u32) -> [u8; N1_HEADER_LEN] {
    n1_header(outbound, vmpi_id)
}

/// The Ethernet frame `frame` with the 802.1Q tag of VLAN `vlan` inserted
/// after the MAC addresses (as the kernel hands a received frame's tag
/// aside); a frame too short for the addresses comes back as it was.
pub fn vlan_tagged(frame: &[u8], vlan: u16) -> Vec<u8> {
    if frame.len() < 12 {
        return frame.to_vec();
    }
    let mut f = Vec::with_capacity(frame.len() + 4);
    f.extend_from_slice(&frame[..12]);
    f.extend_from_slice(&0x8100u16.to_be_bytes());
    f.extend_from_slice(&(vlan & 0x0fff).to_be_bytes());
    f.extend_from_slice(&frame[12..]);
    f
}

/// The IP and UDP headers of `payload` sent from `src` to `dst`: IPv4 (TTL
/// 64, header checksum, UDP checksum 0) when both are IPv4, else IPv6 (an
/// IPv4 address mapped, UDP checksum computed). The lengths saturate for a
/// payload over 64 KiB.
pub fn ip_udp_header(src: SocketAddr, dst: SocketAddr, payload: &[u8]) -> Vec<u8> {
    let udp_len = (8 + payload.len()).min(0xffff) as u16;
    let mut udp = [0u8; 8];
    udp[0..2].copy_from_slice(&src.port().to_be_bytes());
    udp[2..4].copy_from_slice(&dst.port().to_be_bytes());
    udp[4..6].copy_from_slice(&udp_len.to_be_bytes());
    match (src.ip(), dst.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let mut ip = [0u8; 20];
            ip[0] = 0x45;
            let total = udp_len.saturating_add(20);
            ip[2..4].copy_from_slice(&total.to_be_bytes());
            ip[6] = 0x40; // don't fragment
            ip[8] = 64;
            ip[9] = 17;
            ip[12..16].copy_from_slice(&s.octets());
            ip[16..20].copy_from_slice(&d.octets());
            let sum = !fold(sum16(0, &ip));
            ip[10..12].copy_from_slice(&sum.to_be_bytes());
            [&ip[..], &udp[..]].concat()
        }
        (s, d) => {
            let (s, d) = (v6(s).octets(), v6(d).octets());
            let mut ip = [0u8; 40];
            ip[0] = 0x60;
            ip[4..6].copy_from_slice(&udp_len.to_be_bytes());
            ip[6] = 17;
            ip[7] = 64;
            ip[8..24].copy_from_slice(&s);
            ip[24..40].copy_from_slice(&d);
            // Pseudo-header, UDP header and payload.
            let mut acc = sum16(sum16(0, &s), &d);
            acc += u64::from(udp_len) + 17;
            acc = sum16(sum16(acc, &udp), payload);
            let sum = match !fold(acc) {
                0 => 0xffff,
                c => c,
            };
            udp[6..8].copy_from_slice(&sum.to_be_bytes());
            [&ip[..], &udp[..]].concat()
        }
    }
}

fn v6(a: IpAddr) -> Ipv6Addr {
    match a {
        IpAddr::V4(a) => a.to_ipv6_mapped(),
        IpAddr::V6(a) => a,
    }
}

/// Adds `b` as 16-bit big-endian words (an odd last byte padded) to `acc`.
fn sum16(mut acc: u64, b: &[u8]) -> u64 {
    let mut chunks = b.chunks_exact(2);
    for c in &mut chunks {
        acc += u64::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = chunks.remainder() {
        acc += u64::from(*last) << 8;
    }
    acc
}

/// The ones' complement sum folded to 16 bits.
fn fold(mut acc: u64) -> u16 {
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc as u16
}

/// One record: its header (time since the Unix epoch, captured and
/// original lengths) and `parts` concatenated, cut at `snaplen` bytes.
pub fn record(since_epoch: std::time::Duration, parts: &[&[u8]], snaplen: u32) -> Vec<u8> {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    let cap = len.min(snaplen as usize);
    let mut out = Vec::with_capacity(RECORD_HEADER_LEN + cap);
    out.extend((since_epoch.as_secs() as u32).to_le_bytes());
    out.extend(since_epoch.subsec_micros().to_le_bytes());
    out.extend((cap as u32).to_le_bytes());
    out.extend((len as u32).to_le_bytes());
    for p in parts {
        let room = RECORD_HEADER_LEN + cap - out.len();
        out.extend(&p[..p.len().min(room)]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn header_and_records_are_classic_pcap() {
        let h = file_header(LINKTYPE_RINA_N1, 100);
        assert_eq!(&h[..4], &[0xd4, 0xc3, 0xb2, 0xa1]);
        assert_eq!(u32::from_le_bytes(h[20..24].try_into().unwrap()), 147);
        let p = n1_header(true, 0x0102_0304);
        assert_eq!(p, [1, 1, 0, 0, 1, 2, 3, 4]);
        let r = record(Duration::new(5, 7_000), &[&p, b"abc"], 100);
        assert_eq!(&r[..8], &[5, 0, 0, 0, 7, 0, 0, 0]);
        assert_eq!(&r[8..16], &[11, 0, 0, 0, 11, 0, 0, 0]);
        assert_eq!(&r[16..], &[1, 1, 0, 0, 1, 2, 3, 4, b'a', b'b', b'c']);
        // Cut at the snapshot length; the original length stays.
        let r = record(Duration::ZERO, &[&p, b"abc"], 9);
        assert_eq!(&r[8..16], &[9, 0, 0, 0, 11, 0, 0, 0]);
        assert_eq!(r.len(), 16 + 9);
    }

    #[test]
    fn udp_datagrams_get_valid_ip_and_udp_headers() {
        let a: SocketAddr = "127.0.0.1:4000".parse().unwrap();
        let b: SocketAddr = "127.0.0.2:5000".parse().unwrap();
        let h = ip_udp_header(a, b, b"hello");
        assert_eq!(h.len(), 28);
        assert_eq!((h[0], h[9]), (0x45, 17));
        assert_eq!(&h[2..4], &33u16.to_be_bytes());
        // A valid header checksums to zero.
        assert_eq!(fold(sum16(0, &h[..20])), 0xffff);
        assert_eq!(&h[20..24], &[0x0f, 0xa0, 0x13, 0x88]);
        assert_eq!(&h[24..26], &13u16.to_be_bytes());
        // IPv6 (a v4 peer of a v6 socket is mapped): the UDP checksum over
        // the pseudo-header verifies.
        let c: SocketAddr = "[::1]:6000".parse().unwrap();
        let h = ip_udp_header(c, a, b"odd");
        assert_eq!((h.len(), h[0], h[6]), (48, 0x60, 17));
        let mut acc = sum16(sum16(0, &h[8..40]), &h[40..48]);
        acc = sum16(acc + 11 + 17, b"odd");
        assert_eq!(fold(acc), 0xffff);
    }

    #[test]
    fn a_stripped_vlan_tag_goes_back_after_the_addresses() {
        let f: Vec<u8> = (0..16).collect();
        let t = vlan_tagged(&f, 10);
        assert_eq!(&t[..12], &f[..12]);
        assert_eq!(&t[12..16], &[0x81, 0x00, 0x00, 10]);
        assert_eq!(&t[16..], &f[12..]);
        assert_eq!(vlan_tagged(&[1, 2], 3), vec![1, 2]);
        assert_eq!(vmpi_header(false, 3), [1, 0, 0, 0, 0, 0, 0, 3]);
    }
}
