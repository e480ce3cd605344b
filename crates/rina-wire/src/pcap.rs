//! The pcap format of `rinactl capture`: what a normal IPCP sends and
//! receives on its N-1 flows, for Wireshark and tshark.
//!
//! A classic pcap file (microsecond timestamps) with link type
//! [`LINKTYPE_RINA_N1`] (`LINKTYPE_USER0`, 147). Each packet is an
//! [`N1_HEADER_LEN`]-byte pseudo-header — version (1), direction (0
//! received, 1 sent), two reserved zero bytes, the N-1 port-id (4 bytes,
//! network order) — and then the frame as it travelled on the N-1 flow
//! (the SDU protection's TTL byte, the PCI, the payload, the CRC when the
//! DIF has one). `tools/wireshark/rina.lua` decodes it.
//!
//! The daemon sends each packet as one record ([`record`]: record header
//! and data) on the capture's socket; `rinactl` writes [`file_header`]
//! first and then the records as they come.

/// `LINKTYPE_USER0`: rinad's N-1 frames with their pseudo-header.
pub const LINKTYPE_RINA_N1: u32 = 147;
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
}
