//! Unit tests of delimiting, with explicit time.

use super::*;
use proptest::prelude::*;

const SEC: Duration = Duration::from_secs(1);

fn ms(n: u64) -> Instant {
    Instant::from_nanos(n * 1_000_000)
}

fn pattern(len: usize, salt: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ (i >> 8) as u8 ^ salt)
        .collect()
}

/// Fragments `sdu` and pushes every piece with consecutive sequence numbers
/// from `seq`; returns what came out and the next sequence number.
fn through(r: &mut Reassembler, sdu: &[u8], max_payload: usize, seq: u64) -> (Vec<Vec<u8>>, u64) {
    let mut out = Vec::new();
    let mut pdus = Vec::new();
    fragment(sdu, usize::MAX, max_payload, &mut pdus).unwrap();
    let mut s = seq;
    for p in &pdus {
        if let Some(sdu) = r.push(ms(0), s, p).unwrap() {
            out.push(sdu);
        }
        s += 1;
    }
    (out, s)
}

#[test]
fn delimiter_bytes_match_irati() {
    for (d, b) in [
        (Delimiter::Complete, 0x07),
        (Delimiter::First, 0x05),
        (Delimiter::Middle, 0x04),
        (Delimiter::Last, 0x06),
    ] {
        assert_eq!(d.to_byte(), b);
        assert_eq!(Delimiter::from_byte(b), Some(d));
    }
    for b in (0..=255u8).filter(|b| !(4..=7).contains(b)) {
        assert_eq!(Delimiter::from_byte(b), None);
    }
}

#[test]
fn sdu_of_64k_over_1400_byte_pdus_round_trips() {
    // 1400-byte PDUs, 20 bytes of DT PCI: the caller's payload budget.
    let max_payload = 1400 - 20;
    let sdu = pattern(64 * 1024, 9);
    let mut pdus = Vec::new();
    let n = fragment(&sdu, 64 * 1024, max_payload, &mut pdus).unwrap();
    assert_eq!(n, pdus.len());
    assert_eq!(n, fragment_count(sdu.len(), max_payload));
    assert_eq!(n, (64 * 1024usize).div_ceil(1379));
    assert!(pdus.iter().all(|p| p.len() <= max_payload));
    assert_eq!(pdus[0][0], FIRST);
    assert!(pdus[1..n - 1].iter().all(|p| p[0] == MIDDLE));
    assert_eq!(pdus[n - 1][0], LAST);

    let mut r = Reassembler::new(64 * 1024, SEC);
    for (i, p) in pdus.iter().enumerate() {
        let got = r.push(ms(i as u64), 100 + i as u64, p).unwrap();
        if i + 1 < n {
            assert!(got.is_none());
            assert_eq!(r.partial_len(), (i + 1) * (max_payload - 1));
        } else {
            assert_eq!(got.as_deref(), Some(&sdu[..]));
        }
    }
    assert_eq!(r.partial_len(), 0);
    assert_eq!(r.poll_timeout(), None);
    let c = r.counters();
    assert_eq!((c.sdus_complete, c.fragments_in), (1, n as u64));
    assert_eq!(c.discarded_gap + c.discarded_oversize + c.malformed, 0);
}

#[test]
fn small_sdu_is_one_complete_pdu_and_is_borrowed() {
    let mut pdus = Vec::new();
    assert_eq!(fragment(b"hello", 100, 6, &mut pdus).unwrap(), 1);
    assert_eq!(pdus, vec![b"\x07hello".to_vec()]);
    let mut r = Reassembler::new(100, SEC);
    let got = r.push_ref(ms(0), 0, &pdus[0]).unwrap().unwrap();
    assert!(matches!(got, Cow::Borrowed(b"hello")));
    // One byte over the budget: two fragments.
    let mut pdus = Vec::new();
    assert_eq!(fragment(b"hello", 100, 5, &mut pdus).unwrap(), 2);
    assert_eq!(pdus, vec![b"\x05hell".to_vec(), b"\x06o".to_vec()]);
}

#[test]
fn fragmenting_rejects_bad_arguments() {
    let mut out = Vec::new();
    assert_eq!(
        fragment(b"", 10, 100, &mut out),
        Err(DelimitError::EmptySdu)
    );
    assert_eq!(
        fragment(&[0; 11], 10, 100, &mut out),
        Err(DelimitError::SduTooLarge { size: 11, max: 10 })
    );
    assert_eq!(
        fragment(b"x", 10, 1, &mut out),
        Err(DelimitError::PayloadTooSmall { max_payload: 1 })
    );
    assert!(out.is_empty());
    // The smallest budget works: one byte per PDU.
    assert_eq!(fragment(b"abc", 10, 2, &mut out), Ok(3));
    assert_eq!(
        out,
        vec![vec![FIRST, b'a'], vec![MIDDLE, b'b'], vec![LAST, b'c']]
    );
}

#[test]
fn malformed_payloads_are_errors_and_break_the_partial_sdu() {
    let mut r = Reassembler::new(100, SEC);
    assert_eq!(
        r.push(ms(0), 0, b""),
        Err(DelimitError::Malformed { byte: None })
    );
    assert_eq!(
        r.push(ms(0), 1, &[COMPLETE]),
        Err(DelimitError::Malformed { byte: None })
    );
    assert_eq!(
        r.push(ms(0), 2, &[0x0f, 1]),
        Err(DelimitError::Malformed { byte: Some(0x0f) })
    );
    assert_eq!(r.push(ms(0), 3, &[FIRST, 1]), Ok(None));
    assert_eq!(
        r.push(ms(0), 4, &[0x00, 2]),
        Err(DelimitError::Malformed { byte: Some(0) })
    );
    assert_eq!(r.partial_len(), 0);
    assert_eq!(r.push(ms(0), 5, &[LAST, 3]), Ok(None));
    let c = *r.counters();
    assert_eq!(c.malformed, 4);
    assert_eq!(c.discarded_interrupted, 1);
    assert_eq!(c.discarded_orphan, 1);
    assert_eq!(c.sdus_complete, 0);
}

#[test]
fn gap_discards_the_partial_sdu_and_orphans_are_dropped() {
    let mut r = Reassembler::new(100, SEC);
    assert_eq!(r.push(ms(0), 10, &[FIRST, 1, 2]), Ok(None));
    assert_eq!(r.push(ms(0), 11, &[MIDDLE, 3]), Ok(None));
    // 12 lost: the partial SDU can never complete.
    assert_eq!(r.push(ms(0), 13, &[MIDDLE, 5]), Ok(None));
    assert_eq!(r.partial_len(), 0);
    assert_eq!(r.push(ms(0), 14, &[LAST, 6]), Ok(None));
    // 15 lost too, but nothing was in progress; a complete SDU gets through.
    assert_eq!(r.push(ms(0), 16, &[COMPLETE, 7]), Ok(Some(vec![7])));
    // A gap just before a first fragment costs the old SDU only.
    assert_eq!(r.push(ms(0), 17, &[FIRST, 8]), Ok(None));
    assert_eq!(r.push(ms(0), 19, &[FIRST, 9]), Ok(None));
    assert_eq!(r.push(ms(0), 20, &[LAST, 10]), Ok(Some(vec![9, 10])));
    let c = *r.counters();
    assert_eq!(c.discarded_gap, 2);
    assert_eq!(c.discarded_orphan, 2);
    assert_eq!(c.sdus_complete, 2);
    assert_eq!(c.fragments_in, 8);
}

#[test]
fn new_sdu_without_gap_discards_the_unfinished_one() {
    let mut r = Reassembler::new(100, SEC);
    assert_eq!(r.push(ms(0), 0, &[FIRST, 1]), Ok(None));
    assert_eq!(r.push(ms(0), 1, &[FIRST, 2]), Ok(None));
    assert_eq!(r.push(ms(0), 2, &[COMPLETE, 3]), Ok(Some(vec![3])));
    assert_eq!(r.counters().discarded_interrupted, 2);
    assert_eq!(r.partial_len(), 0);
}

#[test]
fn sequence_numbers_may_wrap() {
    let mut r = Reassembler::new(100, SEC);
    assert_eq!(r.push(ms(0), u64::MAX, &[FIRST, 1]), Ok(None));
    assert_eq!(r.push(ms(0), 0, &[LAST, 2]), Ok(Some(vec![1, 2])));
    assert_eq!(r.counters().discarded_gap, 0);
}

#[test]
fn timeout_discards_the_partial_sdu_and_frees_it() {
    let mut r = Reassembler::new(10_000, SEC);
    assert_eq!(r.poll_timeout(), None);
    assert_eq!(r.push(ms(100), 0, &[FIRST; 1000]), Ok(None));
    assert_eq!(r.push(ms(900), 1, &[MIDDLE; 1000]), Ok(None));
    assert_eq!(r.partial_len(), 1998);
    // The deadline runs from the first fragment, not the latest.
    assert_eq!(r.poll_timeout(), Some(ms(1100)));
    r.handle_timeout(ms(1099));
    assert_eq!(r.partial_len(), 1998);
    assert_eq!(r.counters().discarded_timeout, 0);
    r.handle_timeout(ms(1100));
    assert_eq!(r.partial_len(), 0);
    assert!(r.partial.is_none(), "the buffer itself is dropped");
    assert_eq!(r.poll_timeout(), None);
    assert_eq!(r.counters().discarded_timeout, 1);
    // The rest of that SDU arrives late: orphans.
    assert_eq!(r.push(ms(1200), 2, &[LAST, 1]), Ok(None));
    assert_eq!(r.counters().discarded_orphan, 1);
    // Idle calls are harmless.
    r.handle_timeout(ms(5000));
    assert_eq!(r.counters().discarded_timeout, 1);
}

#[test]
fn a_late_push_expires_the_partial_sdu_first() {
    // The driver did not get round to handle_timeout before the next PDU.
    let mut r = Reassembler::new(100, SEC);
    assert_eq!(r.push(ms(0), 0, &[FIRST, 1]), Ok(None));
    assert_eq!(r.push(ms(1000), 1, &[LAST, 2]), Ok(None));
    let c = *r.counters();
    assert_eq!(
        (c.discarded_timeout, c.discarded_orphan, c.sdus_complete),
        (1, 1, 0)
    );
}

#[test]
fn oversize_sdus_are_discarded() {
    let max = 1000;
    let mut r = Reassembler::new(max, SEC);
    let big = pattern(1500, 1);
    let mut pdus = Vec::new();
    fragment(&big, usize::MAX, 400, &mut pdus).unwrap();
    assert_eq!(pdus.len(), 4); // 399 + 399 + 399 + 303
    assert_eq!(r.push(ms(0), 0, &pdus[0]), Ok(None));
    assert_eq!(r.push(ms(0), 1, &pdus[1]), Ok(None));
    assert_eq!(r.partial_len(), 798);
    assert_eq!(
        r.push(ms(0), 2, &pdus[2]),
        Err(DelimitError::Oversize { size: 1197, max })
    );
    assert_eq!(r.partial_len(), 0);
    assert_eq!(r.poll_timeout(), None);
    assert_eq!(r.push(ms(0), 3, &pdus[3]), Ok(None)); // orphan
                                                      // A complete SDU that is too large on its own.
    let mut one = vec![COMPLETE];
    one.extend_from_slice(&big[..1001]);
    assert_eq!(
        r.push(ms(0), 4, &one),
        Err(DelimitError::Oversize { size: 1001, max })
    );
    // Exactly max is fine, fragmented or not.
    let ok = pattern(max, 2);
    let (got, next) = through(&mut r, &ok, 400, 5);
    assert_eq!(got, vec![ok.clone()]);
    let (got, _) = through(&mut r, &ok, 2000, next);
    assert_eq!(got, vec![ok]);
    let c = *r.counters();
    assert_eq!(
        (c.discarded_oversize, c.discarded_orphan, c.sdus_complete),
        (2, 1, 2)
    );
}

#[test]
fn partial_buffer_capacity_stays_within_max_sdu() {
    let max = 5000;
    let mut r = Reassembler::new(max, SEC);
    let sdu = pattern(max, 3);
    let mut pdus = Vec::new();
    fragment(&sdu, max, 100, &mut pdus).unwrap();
    let n = pdus.len();
    for (i, p) in pdus[..n - 1].iter().enumerate() {
        r.push(ms(0), i as u64, p).unwrap();
        assert!(r.partial.as_ref().unwrap().held.rest.capacity() <= max);
    }
    let got = r
        .push(ms(0), (n - 1) as u64, &pdus[n - 1])
        .unwrap()
        .unwrap();
    assert_eq!(got, sdu);
    assert!(got.capacity() <= max);
}

/// The fragments of `sdu` for payloads of `max_payload` bytes, each in a
/// buffer with the room a received PDU has.
fn fragment_bufs(sdu: &[u8], max_payload: usize) -> Vec<PduBuf> {
    let mut pdus = Vec::new();
    fragment(sdu, sdu.len(), max_payload, &mut pdus).unwrap();
    pdus.iter().map(|p| PduBuf::with_headroom(p)).collect()
}

#[test]
fn fragments_in_buffers_are_gathered_without_a_copy() {
    let sdu = pattern(10_000, 9);
    let bufs = fragment_bufs(&sdu, 1400);
    let n = bufs.len();
    let mut r = Reassembler::new(65_535, SEC);
    let before = crate::buf::stats();
    let mut out = None;
    for (i, b) in bufs.into_iter().enumerate() {
        out = r.push_buf(ms(0), i as u64, b).unwrap();
        assert_eq!(out.is_some(), i == n - 1);
    }
    let got = out.unwrap();
    assert_eq!(
        crate::buf::stats().copies,
        before.copies,
        "reassembly copied"
    );
    assert_eq!(got.parts().len(), n);
    assert_eq!(got, sdu);
    assert_eq!(r.partial_len(), 0);
    assert_eq!(r.counters().sdus_complete, 1);
}

#[test]
fn tiny_fragments_in_buffers_cost_a_bounded_amount() {
    // 1-byte fragments, each in a buffer of its own: past the bound the
    // rest is copied, so what is held stays within 2 × max_sdu plus one
    // large buffer plus the copied rest (at most max_sdu).
    let max = 20_000;
    let sdu = pattern(max, 4);
    let bufs = fragment_bufs(&sdu, 2);
    let n = bufs.len();
    let mut r = Reassembler::new(max, SEC);
    let bound = 2 * max + crate::buf::CLASSES[1];
    let mut out = None;
    for (i, b) in bufs.into_iter().enumerate() {
        out = r.push_buf(ms(0), i as u64, b).unwrap();
        if let Some(p) = r.partial.as_ref() {
            assert!(p.held.parts_cap <= bound);
            assert!(p.held.rest.capacity() <= max);
        }
    }
    assert_eq!(n, max);
    assert_eq!(out.unwrap(), sdu);
}

#[test]
fn a_gap_drops_the_gathered_fragments() {
    let sdu = pattern(5_000, 1);
    let mut r = Reassembler::new(65_535, SEC);
    let mut bufs = fragment_bufs(&sdu, 1400).into_iter();
    assert!(r
        .push_buf(ms(0), 0, bufs.next().unwrap())
        .unwrap()
        .is_none());
    assert!(r.partial_len() > 0);
    bufs.next();
    // Sequence number 1 never came: the rest are orphans.
    for (i, b) in bufs.enumerate() {
        assert!(r.push_buf(ms(0), i as u64 + 2, b).unwrap().is_none());
    }
    assert_eq!(r.partial_len(), 0);
    assert_eq!(r.counters().discarded_gap, 1);
    assert_eq!(r.counters().sdus_complete, 0);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn any_sdu_round_trips(len in 1usize..=70_000, max_payload in 2usize..=9000, salt in any::<u8>(), seq0 in any::<u64>()) {
        let sdu = pattern(len, salt);
        let frags = fragments(&sdu, 70_000, max_payload).unwrap();
        let n = frags.len();
        prop_assert_eq!(n, fragment_count(len, max_payload));
        let mut r = Reassembler::new(70_000, SEC);
        let mut buf = Vec::with_capacity(max_payload);
        let mut out = None;
        for (i, (d, piece)) in frags.enumerate() {
            buf.clear();
            buf.push(d.to_byte());
            buf.extend_from_slice(piece);
            prop_assert!(buf.len() <= max_payload);
            prop_assert!(out.is_none());
            out = r.push(ms(0), seq0.wrapping_add(i as u64), &buf).unwrap();
        }
        prop_assert_eq!(out, Some(sdu));
        prop_assert_eq!(r.partial_len(), 0);
    }

    #[test]
    fn losses_never_corrupt_an_sdu(
        sizes in proptest::collection::vec(1usize..3000, 1..10),
        max_payload in 2usize..600,
        drops in proptest::collection::vec(0u8..100, 0..2000),
        loss_pct in 0u8..50,
    ) {
        let max_sdu = 3000;
        let sdus: Vec<Vec<u8>> = sizes.iter().enumerate().map(|(i, &l)| pattern(l, i as u8)).collect();
        // Every PDU gets the next sequence number; a dropped PDU's number is
        // skipped. Each PDU is lost with probability loss_pct %.
        let mut seq = 0u64;
        let mut r = Reassembler::new(max_sdu, SEC);
        let mut delivered = Vec::new();
        let mut expected = Vec::new();
        let mut k = 0usize;
        for sdu in &sdus {
            let mut whole = true;
            let mut payloads = Vec::new();
            fragment(sdu, max_sdu, max_payload, &mut payloads).unwrap();
            for p in &payloads {
                let dropped = drops.get(k).is_some_and(|&d| d < loss_pct);
                k += 1;
                if dropped {
                    whole = false;
                } else if let Some(got) = r.push(ms(0), seq, p).unwrap() {
                    delivered.push(got);
                }
                seq += 1;
            }
            if whole {
                expected.push(sdu.clone());
            }
        }
        for d in &delivered {
            prop_assert!(sdus.contains(d));
        }
        // Stronger: exactly the SDUs that lost nothing come out, in order.
        prop_assert_eq!(&delivered, &expected);
        prop_assert_eq!(r.counters().sdus_complete, expected.len() as u64);
        prop_assert!(r.partial_len() <= max_sdu);
    }

    #[test]
    fn arbitrary_payloads_never_panic(
        pdus in proptest::collection::vec((any::<u64>(), proptest::collection::vec(any::<u8>(), 0..40)), 0..50),
    ) {
        let mut r = Reassembler::new(64, SEC);
        for (i, (seq, p)) in pdus.iter().enumerate() {
            let seq = if seq % 3 == 0 { *seq } else { i as u64 };
            if let Ok(Some(sdu)) = r.push(ms(i as u64 * 100), seq, p) {
                prop_assert!(!sdu.is_empty() && sdu.len() <= 64);
            }
            prop_assert!(r.partial_len() <= 64);
            r.handle_timeout(ms(i as u64 * 100));
        }
    }
}
