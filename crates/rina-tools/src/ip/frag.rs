//! IPv4 fragmentation (RFC 791 §3.2, "Fragmentation and Reassembly"), for a
//! packet larger than the flow that is to carry it and whose sender allows
//! it to be cut (DF clear), as a router would: the far end's kernel puts
//! the fragments back together.
//!
//! Each fragment has the original header with its total length, MF flag,
//! fragment offset (in 8-byte units) and header checksum set anew; every
//! fragment but the last carries a multiple of 8 data bytes and has MF
//! set, the last keeps the original's MF (a fragment may be cut again).
//! The first fragment keeps all the options; the others only those whose
//! "copied" bit is set, padded to a 4-byte boundary with end-of-options.

use thiserror::Error;

/// Why a packet was not cut into fragments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum FragError {
    /// Not an IPv4 packet whose header agrees with its length.
    #[error("not a whole IPv4 packet")]
    NotIpv4,
    /// The sender set DF: the packet may not be fragmented.
    #[error("the packet has DF set")]
    DontFragment,
    /// The MTU leaves no room for 8 data bytes behind the header.
    #[error("an MTU of {mtu} bytes leaves no room for data behind a {header}-byte header")]
    MtuTooSmall {
        /// The MTU asked for.
        mtu: usize,
        /// The packet's header length.
        header: usize,
    },
    /// An option runs past the header or has a length below 2.
    #[error("malformed IPv4 options")]
    BadOptions,
    /// A fragment would lie past the largest offset the header can hold.
    #[error("a fragment would lie past the largest fragment offset")]
    OffsetOverflow,
}

/// Flag bits in the flags-and-offset word.
const DF: u16 = 0x4000;
const MF: u16 = 0x2000;
const OFFSET: u16 = 0x1fff;

/// Whether the packet whose first bytes are `head` is IPv4 with DF clear:
/// one that [`fragment_v4`] may cut.
pub fn may_fragment(head: &[u8]) -> bool {
    head.len() >= 20 && head[0] >> 4 == 4 && head[6] & 0x40 == 0
}

/// Cuts IPv4 packet `pkt` (bytes past its total length are ignored) into
/// fragments of at most `mtu` bytes and hands each to `out`, in order,
/// until `out` returns `false`; a packet that fits is handed over whole.
/// Returns how many were handed over. Nothing is handed over on error.
pub fn fragment_v4(
    pkt: &[u8],
    mtu: usize,
    mut out: impl FnMut(&[u8]) -> bool,
) -> Result<usize, FragError> {
    let (ihl, total) = header_lengths(pkt)?;
    let pkt = &pkt[..total];
    if total <= mtu {
        out(pkt);
        return Ok(1);
    }
    let word = u16::from_be_bytes([pkt[6], pkt[7]]);
    if word & DF != 0 {
        return Err(FragError::DontFragment);
    }
    if mtu < ihl + 8 {
        return Err(FragError::MtuTooSmall { mtu, header: ihl });
    }
    let copied = copied_options(&pkt[20..ihl])?;
    let data = &pkt[ihl..];
    let first_offset = usize::from(word & OFFSET);
    if first_offset + (data.len() - 1) / 8 > usize::from(OFFSET) {
        return Err(FragError::OffsetOverflow);
    }
    let mut later_header = pkt[..20].to_vec();
    later_header.extend_from_slice(&copied);
    later_header[0] = 0x40 | (later_header.len() / 4) as u8;
    let mut frag = Vec::with_capacity(mtu);
    let (mut pos, mut count) = (0, 0);
    while pos < data.len() {
        let header = if pos == 0 { &pkt[..ihl] } else { &later_header };
        let room = (mtu - header.len()) & !7;
        let last = data.len() - pos <= room;
        let take = if last { data.len() - pos } else { room };
        frag.clear();
        frag.extend_from_slice(header);
        frag.extend_from_slice(&data[pos..pos + take]);
        let flags = (word & !(DF | MF | OFFSET)) | if last { word & MF } else { MF };
        let offset = (first_offset + pos / 8) as u16;
        set_header(&mut frag, header.len(), flags | offset);
        count += 1;
        if !out(&frag) {
            break;
        }
        pos += take;
    }
    Ok(count)
}

/// The header length and total length of IPv4 packet `pkt`, checked.
fn header_lengths(pkt: &[u8]) -> Result<(usize, usize), FragError> {
    if pkt.len() < 20 || pkt[0] >> 4 != 4 {
        return Err(FragError::NotIpv4);
    }
    let ihl = usize::from(pkt[0] & 0x0f) * 4;
    let total = usize::from(u16::from_be_bytes([pkt[2], pkt[3]]));
    if ihl < 20 || total <= ihl || total > pkt.len() {
        return Err(FragError::NotIpv4);
    }
    Ok((ihl, total))
}

/// The options among `opts` whose copied bit is set, padded with
/// end-of-options to a multiple of 4 bytes.
fn copied_options(opts: &[u8]) -> Result<Vec<u8>, FragError> {
    let mut copied = Vec::new();
    let mut i = 0;
    while i < opts.len() {
        match opts[i] {
            // End of options.
            0 => break,
            // No operation (not copied).
            1 => i += 1,
            kind => {
                let len = usize::from(*opts.get(i + 1).ok_or(FragError::BadOptions)?);
                if len < 2 || i + len > opts.len() {
                    return Err(FragError::BadOptions);
                }
                if kind & 0x80 != 0 {
                    copied.extend_from_slice(&opts[i..i + len]);
                }
                i += len;
            }
        }
    }
    copied.resize(copied.len().next_multiple_of(4), 0);
    Ok(copied)
}

/// Sets the total length, the flags-and-offset word and the checksum of
/// the fragment `frag` whose header is `ihl` bytes long.
fn set_header(frag: &mut [u8], ihl: usize, flags_offset: u16) {
    let total = frag.len() as u16;
    frag[2..4].copy_from_slice(&total.to_be_bytes());
    frag[6..8].copy_from_slice(&flags_offset.to_be_bytes());
    frag[10..12].copy_from_slice(&[0, 0]);
    let mut sum: u32 = frag[..ihl]
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], c[1]])))
        .sum();
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    frag[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// An IPv4 packet with `options` (a multiple of 4 bytes) and `data`,
    /// flags-and-offset word `word`, ID 0x1234.
    fn packet(options: &[u8], data: &[u8], word: u16) -> Vec<u8> {
        let ihl = 20 + options.len();
        let total = (ihl + data.len()) as u16;
        let mut p = vec![0x40 | (ihl / 4) as u8, 0xb8];
        p.extend_from_slice(&total.to_be_bytes());
        p.extend_from_slice(&[0x12, 0x34]);
        p.extend_from_slice(&word.to_be_bytes());
        p.extend_from_slice(&[64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2]);
        p.extend_from_slice(options);
        p.extend_from_slice(data);
        set_header(&mut p, ihl, word);
        p
    }

    fn sum_ok(header: &[u8]) -> bool {
        let mut sum: u32 = header
            .chunks(2)
            .map(|c| u32::from(u16::from_be_bytes([c[0], c[1]])))
            .sum();
        while sum >> 16 != 0 {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        sum == 0xffff
    }

    fn fragments(pkt: &[u8], mtu: usize) -> Vec<Vec<u8>> {
        let mut v = Vec::new();
        fragment_v4(pkt, mtu, |f| {
            v.push(f.to_vec());
            true
        })
        .expect("fragmented");
        v
    }

    /// Puts `frags` back together as a receiver does (RFC 791's
    /// reassembly, checking each fragment on the way): the header of the
    /// first fragment with the whole length and the original's MF, and the
    /// data in offset order.
    fn reassemble(frags: &[Vec<u8>], mtu: usize) -> Vec<u8> {
        let mut data = Vec::new();
        let first = &frags[0];
        let ihl = usize::from(first[0] & 0x0f) * 4;
        let first_offset = usize::from(u16::from_be_bytes([first[6], first[7]]) & OFFSET) * 8;
        for (i, f) in frags.iter().enumerate() {
            assert!(f.len() <= mtu, "fragment {i} of {} > {mtu}", f.len());
            let h = usize::from(f[0] & 0x0f) * 4;
            assert!(sum_ok(&f[..h]), "fragment {i}: header checksum");
            assert_eq!(usize::from(u16::from_be_bytes([f[2], f[3]])), f.len());
            assert_eq!(f[4..6], first[4..6], "same ID");
            assert_eq!(f[12..20], first[12..20], "same addresses");
            let word = u16::from_be_bytes([f[6], f[7]]);
            assert_eq!(usize::from(word & OFFSET) * 8, first_offset + data.len());
            if i + 1 < frags.len() {
                assert!(word & MF != 0, "fragment {i}: MF");
                assert_eq!((f.len() - h) % 8, 0, "fragment {i}: data a multiple of 8");
            }
            data.extend_from_slice(&f[h..]);
        }
        let last = frags.last().unwrap();
        let mut p = first[..ihl].to_vec();
        p.extend_from_slice(&data);
        let word = (u16::from_be_bytes([first[6], first[7]]) & !MF)
            | (u16::from_be_bytes([last[6], last[7]]) & MF);
        set_header(&mut p, ihl, word);
        p
    }

    #[test]
    fn fragments_reassemble_to_the_original_and_fit() {
        let data: Vec<u8> = (0..5008u32).map(|i| (i * 7) as u8).collect();
        let orig = packet(&[], &data, 0);
        let frags = fragments(&orig, 3000);
        assert_eq!(frags.len(), 2);
        assert_eq!(frags[0].len(), 20 + 2976);
        assert_eq!(reassemble(&frags, 3000), orig);
        // The smallest MTU IPv4 allows: 48 data bytes per fragment.
        let frags = fragments(&orig, 68);
        assert_eq!(frags.len(), 5008usize.div_ceil(48));
        assert_eq!(reassemble(&frags, 68), orig);
    }

    #[test]
    fn only_copied_options_go_into_later_fragments() {
        // NOP, record route (not copied, 7 bytes), router alert (copied,
        // 4 bytes), end of options: 12 bytes.
        let opts = [1, 7, 7, 4, 0, 0, 0, 0, 0x94, 4, 0, 0];
        let orig = packet(&opts, &[0xab; 1000], 0);
        let frags = fragments(&orig, 576);
        assert_eq!(frags[0][0], 0x48);
        assert_eq!(&frags[0][20..32], &opts, "the first keeps them all");
        for f in &frags[1..] {
            assert_eq!(f[0], 0x46, "IHL 6: 20 bytes and the router alert");
            assert_eq!(&f[20..24], &[0x94, 4, 0, 0]);
        }
        assert_eq!(reassemble(&frags, 576), orig);
    }

    #[test]
    fn a_fragment_is_cut_again_keeping_its_offset_and_mf() {
        // The middle of a larger packet: offset 100 (800 bytes), MF set.
        let orig = packet(&[], &[5; 2000], MF | 100);
        let frags = fragments(&orig, 1000);
        assert_eq!(frags.len(), 3);
        assert!(frags.iter().all(|f| f[6] & 0x20 != 0), "MF on all");
        assert_eq!(u16::from_be_bytes([frags[0][6], frags[0][7]]) & OFFSET, 100);
        assert_eq!(reassemble(&frags, 1000), orig);
        // The last piece of a packet stays the last.
        let orig = packet(&[], &[5; 2000], 100);
        let frags = fragments(&orig, 1000);
        assert_eq!(frags.last().unwrap()[6] & 0x20, 0);
    }

    #[test]
    fn refused_packets_hand_nothing_over() {
        let mut called = false;
        let mut out = |_: &[u8]| {
            called = true;
            true
        };
        let big = packet(&[], &[0; 3000], DF);
        assert_eq!(
            fragment_v4(&big, 1500, &mut out),
            Err(FragError::DontFragment)
        );
        let big = packet(&[], &[0; 3000], 0);
        assert!(matches!(
            fragment_v4(&big, 27, &mut out),
            Err(FragError::MtuTooSmall { .. })
        ));
        let bad_opts = packet(&[0x94, 9, 0, 0], &[0; 3000], 0);
        assert_eq!(
            fragment_v4(&bad_opts, 1500, &mut out),
            Err(FragError::BadOptions)
        );
        let mut far = packet(&[], &[0; 3000], 0);
        far[6..8].copy_from_slice(&0x1f00u16.to_be_bytes());
        assert_eq!(
            fragment_v4(&far, 1500, &mut out),
            Err(FragError::OffsetOverflow)
        );
        assert_eq!(
            fragment_v4(&[0x60; 60], 1500, &mut out),
            Err(FragError::NotIpv4)
        );
        assert!(!called);
        // One that fits is handed over whole.
        let small = packet(&[], &[1; 100], DF);
        assert_eq!(fragments(&small, 1500), vec![small.clone()]);
        assert!(may_fragment(&packet(&[], &[], 0)));
        assert!(!may_fragment(&small) && !may_fragment(&[0x60; 40]));
    }

    proptest! {
        #[test]
        fn any_packet_reassembles_from_fragments_that_fit(
            len in 1usize..9000,
            mtu in 68usize..4000,
            router_alert in any::<bool>(),
        ) {
            let opts: &[u8] = if router_alert { &[0x94, 4, 0, 0] } else { &[] };
            let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            let orig = packet(opts, &data, 0);
            let frags = fragments(&orig, mtu);
            prop_assert_eq!(reassemble(&frags, mtu), orig);
        }

        #[test]
        fn any_bytes_fragment_or_fail_without_panicking(
            b in proptest::collection::vec(any::<u8>(), 0..300),
            mtu in 0usize..400,
        ) {
            let _ = fragment_v4(&b, mtu, |f| f.len() <= mtu.max(b.len()));
        }
    }
}
