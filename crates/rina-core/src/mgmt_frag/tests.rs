//! Unit tests of fragmentation and reassembly, with explicit time.

use super::*;
use proptest::prelude::*;

fn ms(n: u64) -> Instant {
    Instant::from_nanos(n * 1_000_000)
}

fn message(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn reasm() -> Reassembler {
    Reassembler::new(1 << 20, Duration::from_secs(5), 8)
}

#[test]
fn header_format_is_documented_one() {
    let f = Fragmenter::split(0x0102_0304, b"abcdef", 16).unwrap();
    assert_eq!(f.len(), 2);
    assert_eq!(
        &f[0][..HEADER_LEN],
        &[1, 2, 3, 4, 0, 0, 0, 2, 0, 0, 0, 6][..]
    );
    assert_eq!(&f[0][HEADER_LEN..], b"abcd");
    assert_eq!(
        &f[1][..HEADER_LEN],
        &[1, 2, 3, 4, 0, 1, 0, 2, 0, 0, 0, 6][..]
    );
    assert_eq!(&f[1][HEADER_LEN..], b"ef");
}

#[test]
fn a_count_above_the_length_is_refused_before_anything_is_held() {
    let mut r = reasm();
    let mut f = Vec::new();
    FragHeader {
        msg_id: 9,
        index: 0,
        count: u16::MAX,
        total_len: 10,
    }
    .write(&mut f);
    f.extend_from_slice(b"ab");
    assert_eq!(r.push(ms(0), 0, &f), Err(FragError::Inconsistent(9)));
    assert_eq!(r.pending_len(), 0);
    assert_eq!(r.counters().inconsistent, 1);
    // As many fragments as bytes is still fine.
    let whole = message(3, 1);
    for (i, b) in whole.iter().enumerate() {
        let mut f = Vec::new();
        FragHeader {
            msg_id: 10,
            index: i as u16,
            count: 3,
            total_len: 3,
        }
        .write(&mut f);
        f.push(*b);
        let got = r.push(ms(1), 0, &f).unwrap();
        assert_eq!(got.is_some(), i == 2);
    }
}

#[test]
fn split_limits() {
    assert_eq!(
        Fragmenter::split(0, b"x", HEADER_LEN),
        Err(FragError::MaxPayloadTooSmall(HEADER_LEN))
    );
    let empty = Fragmenter::split(0, b"", 100).unwrap();
    assert_eq!(empty.len(), 1);
    assert_eq!(empty[0].len(), HEADER_LEN);
    let mut r = reasm();
    assert_eq!(r.push(ms(0), 1, &empty[0]), Ok(Some(Vec::new())));
    // 65 536 one-byte fragments are too many.
    let big = vec![0u8; 65_536];
    assert_eq!(
        Fragmenter::split(0, &big, HEADER_LEN + 1),
        Err(FragError::MessageTooLarge(65_536))
    );
    assert_eq!(
        Fragmenter::split(0, &big[..65_535], HEADER_LEN + 1)
            .unwrap()
            .len(),
        65_535
    );
}

#[test]
fn fragmenter_counts_ids() {
    let mut f = Fragmenter::new();
    let a = f.fragment(b"one", 100).unwrap();
    let b = f.fragment(b"two", 100).unwrap();
    assert_eq!(FragHeader::parse(&a[0]).unwrap().0.msg_id, 0);
    assert_eq!(FragHeader::parse(&b[0]).unwrap().0.msg_id, 1);
}

#[test]
fn large_message_reassembles_in_order() {
    let msg = message(200_000, 7);
    let frags = Fragmenter::split(9, &msg, 1400).unwrap();
    assert_eq!(frags.len(), 200_000usize.div_ceil(1400 - HEADER_LEN));
    assert_eq!(frags.len(), 145);
    assert!(frags.iter().all(|f| f.len() <= 1400));
    let mut r = reasm();
    let (last, rest) = frags.split_last().unwrap();
    for f in rest {
        assert_eq!(r.push(ms(1), 3, f), Ok(None));
    }
    assert_eq!(r.pending_len(), 1);
    assert_eq!(r.pending_bytes(), 144 * 1388);
    assert_eq!(r.push(ms(2), 3, last), Ok(Some(msg)));
    assert_eq!(r.pending_len(), 0);
    assert_eq!(r.pending_bytes(), 0);
    assert_eq!(r.counters().reassembled, 1);
    assert_eq!(r.counters().rx_fragments, 145);
}

#[test]
fn out_of_order_and_duplicates() {
    let msg = message(10_000, 1);
    let mut frags = Fragmenter::split(1, &msg, 1000).unwrap();
    frags.reverse();
    let mut r = reasm();
    let mut got = None;
    for (i, f) in frags.iter().enumerate() {
        // Every fragment twice, and the first one again at the end.
        if let Some(m) = r.push(ms(i as u64), 1, f).unwrap() {
            got = Some(m);
        }
        if got.is_none() {
            assert_eq!(r.push(ms(i as u64), 1, f), Ok(None));
        }
    }
    assert_eq!(got, Some(msg));
    assert_eq!(r.counters().rx_duplicate, 10);
    // A late duplicate of a delivered message is recognised...
    assert_eq!(r.push(ms(100), 1, &frags[3]), Ok(None));
    assert_eq!(r.counters().rx_late, 1);
    assert_eq!(r.pending_len(), 0);
    // ...until the id is forgotten.
    assert!(r.poll_timeout().is_some());
    r.handle_timeout(ms(20_000));
    assert_eq!(r.poll_timeout(), None);
}

#[test]
fn missing_fragment_times_out_and_frees_memory() {
    let msg = message(5000, 2);
    let frags = Fragmenter::split(4, &msg, 1012).unwrap();
    assert_eq!(frags.len(), 5);
    let mut r = reasm();
    for (i, f) in frags.iter().enumerate() {
        if i != 2 {
            assert_eq!(r.push(ms(10), 1, f), Ok(None));
        }
    }
    assert_eq!(r.pending_bytes(), 4000);
    assert_eq!(r.poll_timeout(), Some(ms(5010)));
    assert_eq!(r.handle_timeout(ms(5009)), 0);
    assert_eq!(r.pending_len(), 1);
    assert_eq!(r.handle_timeout(ms(5010)), 1);
    assert_eq!(r.pending_len(), 0);
    assert_eq!(r.pending_bytes(), 0);
    assert_eq!(r.counters().timed_out, 1);
    assert_eq!(r.poll_timeout(), None);
    // The late fragment alone starts a new message that never completes.
    assert_eq!(r.push(ms(6000), 1, &frags[2]), Ok(None));
    assert_eq!(r.handle_timeout(ms(11_000)), 1);
}

#[test]
fn interleaved_messages_from_two_ports() {
    let a = message(3000, 3);
    let b = message(2500, 4);
    // Same message id on both ports: they are different messages.
    let fa = Fragmenter::split(1, &a, 512).unwrap();
    let fb = Fragmenter::split(1, &b, 512).unwrap();
    let mut r = reasm();
    let mut out = Vec::new();
    for i in 0..fa.len().max(fb.len()) {
        if let Some(f) = fa.get(i) {
            if let Some(m) = r.push(ms(0), 10, f).unwrap() {
                out.push((10, m));
            }
        }
        if let Some(f) = fb.get(i) {
            if let Some(m) = r.push(ms(0), 20, f).unwrap() {
                out.push((20, m));
            }
        }
    }
    assert_eq!(out, vec![(20, b), (10, a)]);
}

#[test]
fn inconsistent_fragments_drop_the_message() {
    let msg = message(3000, 5);
    let frags = Fragmenter::split(7, &msg, 1012).unwrap();
    let mut r = reasm();
    assert_eq!(r.push(ms(0), 1, &frags[0]), Ok(None));
    // Same index, other bytes.
    let mut evil = frags[0].clone();
    evil[HEADER_LEN] ^= 1;
    assert_eq!(r.push(ms(0), 1, &evil), Err(FragError::Inconsistent(7)));
    assert_eq!(r.pending_len(), 0);
    // Another count for the same message.
    assert_eq!(r.push(ms(0), 1, &frags[0]), Ok(None));
    let other = Fragmenter::split(7, &msg, 600).unwrap();
    assert_eq!(r.push(ms(0), 1, &other[1]), Err(FragError::Inconsistent(7)));
    // A last fragment of the wrong length.
    assert_eq!(r.push(ms(0), 1, &frags[0]), Ok(None));
    let mut short = frags[2].clone();
    short.pop();
    assert_eq!(r.push(ms(0), 1, &short), Err(FragError::Inconsistent(7)));
    // A single fragment whose length is not the total.
    let mut single = Fragmenter::split(8, b"hello", 100).unwrap().remove(0);
    single.push(b'!');
    assert_eq!(r.push(ms(0), 1, &single), Err(FragError::Inconsistent(8)));
    assert_eq!(r.counters().inconsistent, 4);
    assert_eq!(r.pending_bytes(), 0);
    // Malformed headers.
    assert_eq!(r.push(ms(0), 1, &[0; 5]), Err(FragError::TooShort(5)));
    assert_eq!(
        r.push(ms(0), 1, &[0, 0, 0, 0, 0, 2, 0, 2, 0, 0, 0, 1]),
        Err(FragError::BadIndex { index: 2, count: 2 })
    );
    let mut small = Reassembler::new(100, Duration::from_secs(1), 2);
    let big = Fragmenter::split(1, &[0; 101], 50).unwrap();
    assert_eq!(small.push(ms(0), 1, &big[0]), Err(FragError::TooLarge(101)));
    assert_eq!(r.counters().rx_malformed, 2);
}

#[test]
fn max_pending_evicts_the_oldest() {
    let mut r = Reassembler::new(10_000, Duration::from_secs(5), 2);
    for id in 0..3u32 {
        let f = Fragmenter::split(id, &message(100, 0), 62).unwrap();
        assert_eq!(r.push(ms(u64::from(id)), 1, &f[0]), Ok(None));
    }
    assert_eq!(r.pending_len(), 2);
    assert_eq!(r.counters().evicted, 1);
    assert_eq!(r.pending_bytes(), 100);
    r.drop_port(1);
    assert_eq!(r.pending_len(), 0);
    assert_eq!(r.pending_bytes(), 0);
    assert_eq!(r.counters().port_dropped, 2);
}

#[test]
fn a_port_that_never_finishes_evicts_its_own_messages_not_its_neighbours() {
    // Port 2's message starts first; port 1 then starts ten it never
    // finishes, more than the four that may be pending.
    let mut r = Reassembler::new(10_000, Duration::from_secs(5), 4);
    let theirs = message(300, 7);
    let f2 = Fragmenter::split(99, &theirs, 112).unwrap();
    assert_eq!(r.push(ms(0), 2, &f2[0]), Ok(None));
    for id in 0..10u32 {
        let f = Fragmenter::split(id, &message(300, 0), 112).unwrap();
        assert_eq!(r.push(ms(1 + u64::from(id)), 1, &f[0]), Ok(None));
    }
    assert_eq!(r.pending_len(), 4);
    assert_eq!(r.counters().evicted, 7, "port 1's own");
    // Port 2's message is whole in the end.
    assert_eq!(r.push(ms(20), 2, &f2[1]), Ok(None));
    assert_eq!(r.push(ms(20), 2, &f2[2]), Ok(Some(theirs)));
}

#[test]
fn the_bytes_held_for_incomplete_messages_are_bounded() {
    // Messages of 4,000 bytes, at most 10,000 held: port 1's big
    // unfinished messages make room by evicting each other, and port 2's
    // message is left alone.
    let mut r = Reassembler::new(4_000, Duration::from_secs(5), 64).with_max_bytes(10_000);
    let theirs = message(1_000, 3);
    let f2 = Fragmenter::split(7, &theirs, 612).unwrap();
    assert_eq!(r.push(ms(0), 2, &f2[0]), Ok(None));
    for id in 0..20u32 {
        let f = Fragmenter::split(id, &message(4_000, 1), 3_012).unwrap();
        assert_eq!(r.push(ms(1 + u64::from(id)), 1, &f[0]), Ok(None));
        assert!(r.pending_bytes() <= 10_000, "{} held", r.pending_bytes());
    }
    assert!(r.counters().evicted >= 17, "{:?}", r.counters());
    assert_eq!(r.push(ms(30), 2, &f2[1]), Ok(Some(theirs)));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Random sizes, fragment sizes, orders and duplicates: the message comes
    /// back exactly, once, and nothing is left behind.
    #[test]
    fn random_orders_reassemble_exactly(
        len in 0usize..20_000,
        max in (HEADER_LEN + 1)..3000usize,
        seed in any::<u8>(),
        order in proptest::collection::vec(any::<u32>(), 0..400),
    ) {
        let msg = message(len, seed);
        let frags = Fragmenter::split(42, &msg, max).unwrap();
        prop_assume!(frags.len() < 2000);
        // Every fragment once, plus random duplicates, in random order.
        let mut seq: Vec<usize> = (0..frags.len()).collect();
        seq.extend(order.iter().map(|o| *o as usize % frags.len()));
        for i in (1..seq.len()).rev() {
            let j = order.get(i % order.len().max(1)).copied().unwrap_or(0) as usize % (i + 1);
            seq.swap(i, j);
        }
        let mut r = Reassembler::new(20_000, Duration::from_secs(5), 4);
        let mut got = Vec::new();
        for i in seq {
            if let Some(m) = r.push(ms(0), 1, &frags[i]).unwrap() {
                got.push(m);
            }
        }
        if frags.len() == 1 {
            // Single-fragment messages are not remembered: each copy is
            // delivered.
            prop_assert!(!got.is_empty());
            prop_assert!(got.iter().all(|m| *m == msg));
        } else {
            prop_assert_eq!(got, vec![msg]);
        }
        prop_assert_eq!(r.pending_len(), 0);
        prop_assert_eq!(r.pending_bytes(), 0);
    }

    /// Arbitrary bytes never panic, and memory stays bounded.
    #[test]
    fn arbitrary_fragments_never_panic(
        frags in proptest::collection::vec(
            (0u32..4, 0u16..4, 0u16..5, 0u32..64, proptest::collection::vec(any::<u8>(), 0..40)),
            0..200),
        raw in proptest::collection::vec(any::<u8>(), 0..30),
    ) {
        let mut r = Reassembler::new(64, Duration::from_secs(1), 3);
        let _ = r.push(ms(0), 0, &raw);
        for (t, (id, index, count, total, payload)) in frags.into_iter().enumerate() {
            let mut f = Vec::new();
            FragHeader { msg_id: id, index, count, total_len: total }.write(&mut f);
            f.extend_from_slice(&payload);
            if let Ok(Some(m)) = r.push(ms(t as u64 * 10), u32::from(index % 2), &f) {
                prop_assert_eq!(m.len(), total as usize);
            }
            prop_assert!(r.pending_len() <= 3);
            prop_assert!(r.pending_bytes() <= 3 * 64);
        }
        r.handle_timeout(ms(1_000_000));
        prop_assert_eq!(r.pending_len(), 0);
        prop_assert_eq!(r.pending_bytes(), 0);
    }
}

/// First fragments of messages that claim 65,535 parts hold only what
/// arrived: 64 of them, 13 bytes each, used to reserve 100 MB of part
/// tables that the byte limit never counted.
#[test]
fn a_fragment_claiming_many_parts_holds_only_itself() {
    let mut r = Reassembler::new(4 << 20, Duration::from_secs(5), 64);
    for id in 0..64u32 {
        let mut f = Vec::new();
        FragHeader {
            msg_id: id,
            index: 0,
            count: 65_535,
            total_len: 65_535,
        }
        .write(&mut f);
        f.push(0xAA);
        assert_eq!(r.push(Instant::ZERO, 1, &f), Ok(None));
    }
    assert_eq!((r.pending_len(), r.pending_bytes()), (64, 64));
    assert!(r.pending.values().all(|p| p.parts.len() == 1));
}
