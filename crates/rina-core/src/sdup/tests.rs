//! Unit tests of SDU protection.

use super::*;
use proptest::prelude::*;

/// A toy cipher for the tests: XOR with a key, then a 2-byte checksum tag.
struct XorCipher(u8);

impl XorCipher {
    fn tag(bytes: &[u8]) -> [u8; 2] {
        let s = bytes
            .iter()
            .fold(0u16, |a, &b| a.rotate_left(3) ^ u16::from(b));
        s.to_be_bytes()
    }
}

impl Cipher for XorCipher {
    fn seal(&self, pdu: &mut Vec<u8>) {
        pdu.iter_mut().for_each(|b| *b ^= self.0);
        let tag = Self::tag(pdu);
        pdu.extend_from_slice(&tag);
    }
    fn open(&self, pdu: &mut Vec<u8>) -> Result<(), SdupError> {
        let n = pdu
            .len()
            .checked_sub(2)
            .ok_or_else(|| SdupError::Cipher("no tag".into()))?;
        if pdu[n..] != Self::tag(&pdu[..n]) {
            return Err(SdupError::Cipher("bad tag".into()));
        }
        pdu.truncate(n);
        pdu.iter_mut().for_each(|b| *b ^= self.0);
        Ok(())
    }
    fn overhead(&self) -> usize {
        2
    }
}

fn configs() -> [SdupConfig; 4] {
    [
        SdupConfig {
            ttl: None,
            crc: false,
        },
        SdupConfig {
            ttl: Some(64),
            crc: false,
        },
        SdupConfig {
            ttl: None,
            crc: true,
        },
        SdupConfig {
            ttl: Some(64),
            crc: true,
        },
    ]
}

/// Every configuration, with and without the toy cipher.
fn all_sdups() -> Vec<Sdup> {
    configs()
        .into_iter()
        .flat_map(|c| {
            [
                Sdup::without_cipher(c),
                Sdup::new(c, Box::new(XorCipher(0x5a))),
            ]
        })
        .collect()
}

const PDU: &[u8] = b"\x01\x02 a PDU with its PCI \xff";

#[test]
fn default_config_is_ttl_64_without_crc() {
    let c = SdupConfig::default();
    assert_eq!(
        c,
        SdupConfig {
            ttl: Some(64),
            crc: false
        }
    );
    assert_eq!(Sdup::without_cipher(c).overhead(), 1);
}

#[test]
fn round_trip_in_all_four_combinations() {
    for cfg in configs() {
        let s = Sdup::without_cipher(cfg);
        let mut frame = Vec::new();
        s.protect(PDU, 9, &mut frame);
        assert_eq!(frame.len(), PDU.len() + s.overhead());
        let u = s.unprotect(&frame).unwrap();
        assert_eq!(u.ttl, cfg.ttl.map(|_| 9));
        assert_eq!(&*u.pdu, PDU);
        assert!(
            matches!(u.pdu, Cow::Borrowed(_)),
            "no copy without a cipher"
        );
    }
}

#[test]
fn layout_is_ttl_pdu_crc_in_network_order() {
    let s = Sdup::without_cipher(SdupConfig {
        ttl: Some(64),
        crc: true,
    });
    let mut frame = Vec::new();
    s.protect(b"abc", 64, &mut frame);
    assert_eq!(&frame[..4], b"\x40abc");
    let crc = crc32fast::hash(b"\x40abc");
    assert_eq!(frame[4..], crc.to_be_bytes());
    // The well-known IEEE check value, so other implementations can follow.
    assert_eq!(crc32fast::hash(b"123456789"), 0xcbf4_3926);
}

#[test]
fn cipher_runs_inside_ttl_and_crc() {
    let cfg = SdupConfig {
        ttl: Some(7),
        crc: true,
    };
    let s = Sdup::new(cfg, Box::new(XorCipher(0xff)));
    assert_eq!(s.overhead(), 1 + 2 + 4);
    let mut frame = Vec::new();
    s.protect(b"ab", 7, &mut frame);
    assert_eq!(frame.len(), 1 + 2 + 2 + 4);
    assert_eq!(frame[0], 7, "TTL is in clear");
    assert_eq!(&frame[1..3], &[!b'a', !b'b'], "PDU is sealed");
    let u = s.unprotect(&frame).unwrap();
    assert_eq!((u.ttl, &*u.pdu), (Some(7), &b"ab"[..]));
    assert!(matches!(u.pdu, Cow::Owned(_)));
    // A bad tag with a good CRC is the cipher's error.
    let plain = Sdup::without_cipher(cfg);
    let mut forged = Vec::new();
    plain.protect(b"\x00\x00\x00\x01", 7, &mut forged);
    assert_eq!(
        s.unprotect(&forged),
        Err(SdupError::Cipher("bad tag".into()))
    );
}

#[test]
fn in_place_and_headroom_variants_match_protect() {
    for s in all_sdups() {
        let mut expected = Vec::new();
        s.protect(PDU, 33, &mut expected);

        let mut buf = PDU.to_vec();
        s.protect_in_place(&mut buf, 33);
        assert_eq!(buf, expected);

        // With 8 bytes of headroom: the TTL takes the last of them.
        let mut buf = vec![0xee; 8];
        buf.extend_from_slice(PDU);
        let at = s.protect_in_headroom(&mut buf, 8, 33);
        assert_eq!(at, 8 - s.header_len());
        assert_eq!(&buf[at..], &expected[..]);
        assert!(buf[..at].iter().all(|&b| b == 0xee));

        // With none: same as in place.
        let mut buf = PDU.to_vec();
        assert_eq!(s.protect_in_headroom(&mut buf, 0, 33), 0);
        assert_eq!(buf, expected);
    }
}

#[test]
fn protect_appends_after_existing_bytes() {
    let s = Sdup::without_cipher(SdupConfig {
        ttl: Some(3),
        crc: true,
    });
    let mut out = b"hdr".to_vec();
    s.protect(PDU, 3, &mut out);
    assert_eq!(&out[..3], b"hdr");
    assert_eq!(&*s.unprotect(&out[3..]).unwrap().pdu, PDU);
}

#[test]
fn short_frames_are_truncated_and_ttl_zero_is_expired() {
    let ttl_crc = Sdup::without_cipher(SdupConfig {
        ttl: Some(64),
        crc: true,
    });
    for n in 0..4 {
        assert_eq!(ttl_crc.unprotect(&vec![0; n]), Err(SdupError::Truncated));
    }
    let crc_of_nothing = crc32fast::hash(b"").to_be_bytes();
    assert_eq!(
        ttl_crc.unprotect(&crc_of_nothing),
        Err(SdupError::Truncated)
    );
    let ttl = Sdup::without_cipher(SdupConfig::default());
    assert_eq!(ttl.unprotect(b""), Err(SdupError::Truncated));
    assert_eq!(ttl.unprotect(b"\x00pdu"), Err(SdupError::TtlExpired));
    let cipher = Sdup::new(
        SdupConfig {
            ttl: None,
            crc: false,
        },
        Box::new(XorCipher(1)),
    );
    assert_eq!(
        cipher.unprotect(b"x"),
        Err(SdupError::Cipher("no tag".into()))
    );
}

#[test]
fn ttl_relay_64_hops_then_dropped() {
    let s = Sdup::without_cipher(SdupConfig {
        ttl: Some(DEFAULT_TTL),
        crc: true,
    });
    let mut frame = Vec::new();
    s.protect(PDU, s.initial_ttl().unwrap(), &mut frame);
    let mut hops = 1; // origin -> first receiver
    loop {
        let u = s.unprotect(&frame).unwrap();
        assert_eq!(&*u.pdu, PDU);
        assert_eq!(u.ttl, Some(65 - hops as u8));
        // This receiver is not the destination: relay if the limit allows.
        match Sdup::next_ttl(u.ttl.unwrap()) {
            Some(t) => {
                let pdu = u.pdu.into_owned();
                frame.clear();
                s.protect(&pdu, t, &mut frame);
                hops += 1;
            }
            None => break,
        }
    }
    assert_eq!(hops, 64, "64 hops reached, then the 64th receiver drops it");
    assert_eq!(Sdup::next_ttl(0), None);
    assert_eq!(Sdup::next_ttl(2), Some(1));
    assert_eq!(Sdup::next_ttl(255), Some(254));
}

proptest! {
    #[test]
    fn every_single_bit_flip_is_detected_with_crc(
        pdu in proptest::collection::vec(any::<u8>(), 0..200),
        ttl in 1u8..,
        with_ttl in any::<bool>(),
        with_cipher in any::<bool>(),
    ) {
        let cfg = SdupConfig { ttl: with_ttl.then_some(64), crc: true };
        let s = if with_cipher {
            Sdup::new(cfg, Box::new(XorCipher(0x3c)))
        } else {
            Sdup::without_cipher(cfg)
        };
        let mut frame = Vec::new();
        s.protect(&pdu, ttl, &mut frame);
        prop_assert_eq!(&*s.unprotect(&frame).unwrap().pdu, &pdu[..]);
        for bit in 0..frame.len() * 8 {
            let mut f = frame.clone();
            f[bit / 8] ^= 1 << (bit % 8);
            let r = s.unprotect(&f);
            prop_assert!(matches!(r, Err(SdupError::BadCrc { .. })), "bit {} gave {:?}", bit, r);
        }
    }

    #[test]
    fn arbitrary_frames_never_panic(frame in proptest::collection::vec(any::<u8>(), 0..64)) {
        for s in all_sdups() {
            match s.unprotect(&frame) {
                Ok(u) => {
                    prop_assert!(u.pdu.len() <= frame.len());
                    prop_assert!(u.ttl != Some(0));
                }
                Err(SdupError::Truncated) => prop_assert!(frame.len() < s.overhead()),
                Err(_) => {}
            }
        }
    }

    /// `unprotect_buf` has a path of its own without a cipher: on any
    /// bytes it takes what `unprotect` takes, leaves the same PDU and
    /// refuses with the same error.
    #[test]
    fn unprotect_buf_agrees_with_unprotect(frame in proptest::collection::vec(any::<u8>(), 0..64)) {
        for s in all_sdups() {
            let mut b = crate::buf::PduBuf::from(frame.clone());
            match (s.unprotect(&frame), s.unprotect_buf(&mut b)) {
                (Ok(u), Ok(ttl)) => {
                    prop_assert_eq!(u.ttl, ttl);
                    prop_assert_eq!(&*u.pdu, &b[..]);
                }
                (Err(e), Err(f)) => prop_assert_eq!(e, f),
                (a, b) => prop_assert!(false, "unprotect {:?}, unprotect_buf {:?}", a, b),
            }
        }
    }

    #[test]
    fn any_pdu_round_trips(pdu in proptest::collection::vec(any::<u8>(), 0..2000), ttl in 1u8..) {
        for s in all_sdups() {
            let mut frame = Vec::new();
            s.protect(&pdu, ttl, &mut frame);
            prop_assert_eq!(frame.len(), pdu.len() + s.overhead());
            let u = s.unprotect(&frame).unwrap();
            prop_assert_eq!(&*u.pdu, &pdu[..]);
            prop_assert_eq!(u.ttl, s.initial_ttl().map(|_| ttl));
        }
    }
}

#[test]
fn unprotect_buf_strips_ttl_and_crc_in_place_and_refuses_what_unprotect_refuses() {
    for s in all_sdups() {
        let mut frame = Vec::new();
        s.protect(PDU, 9, &mut frame);
        let before = crate::buf::stats();
        let mut b = crate::buf::PduBuf::from(frame.clone());
        let ttl = s.unprotect_buf(&mut b).unwrap();
        let copies = crate::buf::stats().copies - before.copies;
        assert_eq!(ttl, s.cfg.ttl.map(|_| 9));
        assert_eq!(&b[..], PDU);
        if s.cipher.is_identity() {
            assert_eq!(copies, 0, "no copy without a cipher");
        }
        // A corrupted frame fails the same way as with unprotect.
        if s.cfg.crc || !s.cipher.is_identity() {
            let mut bad = frame.clone();
            let last = bad.len() - 1;
            bad[last] ^= 1;
            let mut b = crate::buf::PduBuf::from(bad.clone());
            assert_eq!(
                s.unprotect_buf(&mut b).unwrap_err(),
                s.unprotect(&bad).unwrap_err()
            );
        }
    }
}
