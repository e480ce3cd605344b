use super::*;

fn pair(seed: u8) -> (SessionKeys, SessionKeys) {
    let a = [seed; 32];
    let b = [seed.wrapping_add(1); 32];
    let (na, nb) = (ephemeral_public(&a), ephemeral_public(&b));
    let ka = SessionKeys::derive(&a, &na, &nb, true).unwrap();
    let kb = SessionKeys::derive(&b, &na, &nb, false).unwrap();
    (ka, kb)
}

fn ports(seed: u8) -> (PortCrypto, PortCrypto) {
    let (ka, kb) = pair(seed);
    let (mut a, mut b) = (PortCrypto::new(), PortCrypto::new());
    a.install(Instant::ZERO, &ka);
    b.install(Instant::ZERO, &kb);
    (a, b)
}

#[test]
fn both_sides_derive_the_same_keys_crosswise() {
    let (ka, kb) = pair(7);
    assert_eq!(ka.id, kb.id);
    assert_eq!(ka.tx, kb.rx);
    assert_eq!(ka.rx, kb.tx);
    assert_ne!(ka.tx, ka.rx);
    assert!(
        !format!("{ka:?}").contains(&format!("{}", ka.tx[0]))
            || format!("{ka:?}").contains("hidden")
    );
}

#[test]
fn a_low_order_point_gives_no_keys() {
    let own = [9u8; 32];
    let zero = [0u8; 32];
    assert_eq!(
        SessionKeys::derive(&own, &ephemeral_public(&own), &zero, true),
        Err(KeyError::NotContributory)
    );
}

#[test]
fn sealed_frames_open_and_hide_the_payload() {
    let (mut a, mut b) = ports(1);
    let msg = b"known payload marker 0123456789".to_vec();
    let sealed = a.seal(&msg).unwrap();
    assert_eq!(sealed.len(), msg.len() + OVERHEAD);
    assert!(!sealed.windows(12).any(|w| w == b"known payload"));
    assert_eq!(b.open(&sealed), Ok(Opened::Sealed(msg.clone())));
    // And the other way.
    let back = b.seal(&msg).unwrap();
    assert_eq!(a.open(&back), Ok(Opened::Sealed(msg)));
    assert_eq!(b.counters.opened, 1);
    assert_eq!(b.counters.sealed, 1);
}

#[test]
fn tampering_anywhere_is_counted_and_dropped() {
    let (mut a, mut b) = ports(2);
    let sealed = a.seal(b"some frame").unwrap();
    for i in 1..sealed.len() {
        let mut t = sealed.clone();
        t[i] ^= 0x40;
        let r = b.open(&t);
        assert!(
            matches!(r, Err(OpenError::BadTag | OpenError::UnknownKey(_))),
            "byte {i}: {r:?}"
        );
    }
    assert_eq!(b.counters.opened, 0);
    assert_eq!(
        b.counters.bad_tag + b.counters.unknown_key,
        sealed.len() as u64 - 1
    );
    // The untouched frame still opens: failures do not advance the window.
    assert!(matches!(b.open(&sealed), Ok(Opened::Sealed(_))));
}

#[test]
fn a_replay_is_counted_and_dropped_and_reordering_within_the_window_is_not() {
    let (mut a, mut b) = ports(3);
    let frames: Vec<_> = (0..10u8).map(|i| a.seal(&[i; 20]).unwrap()).collect();
    for i in [3usize, 0, 1, 9, 2, 5, 4, 8, 7, 6] {
        assert_eq!(b.open(&frames[i]), Ok(Opened::Sealed(vec![i as u8; 20])));
    }
    for f in &frames {
        assert!(matches!(b.open(f), Err(OpenError::Replayed(_))));
    }
    assert_eq!(b.counters.replayed, 10);
    // Far ahead, then something older than the window.
    let mut last = None;
    for _ in 0..REPLAY_WINDOW + 5 {
        last = a.seal(b"x");
    }
    assert!(b.open(&last.unwrap()).is_ok());
    let (mut a2, mut b2) = ports(3);
    let old = a2.seal(b"old").unwrap();
    for _ in 0..REPLAY_WINDOW + 1 {
        a2.seal(b"y");
    }
    let new = a2.seal(b"new").unwrap();
    assert!(b2.open(&new).is_ok());
    assert_eq!(b2.open(&old), Err(OpenError::Replayed(0)));
}

#[test]
fn after_rotation_frames_under_the_previous_key_still_open() {
    let (mut a, mut b) = ports(4);
    let before = a.seal(b"in flight").unwrap();
    let (ka, kb) = pair(40);
    a.install(Instant::ZERO, &ka);
    b.install(Instant::ZERO, &kb);
    let after = a.seal(b"new key").unwrap();
    assert_ne!(before[1..5], after[1..5]);
    assert_eq!(b.open(&after), Ok(Opened::Sealed(b"new key".to_vec())));
    assert_eq!(b.open(&before), Ok(Opened::Sealed(b"in flight".to_vec())));
    // Keys older than RX_KEYS rotations are gone.
    for s in 50..50 + RX_KEYS as u8 {
        let (_, kb) = pair(s);
        b.install(Instant::ZERO, &kb);
    }
    let (mut a3, _) = ports(4);
    let ancient = a3.seal(b"ancient").unwrap();
    assert!(matches!(b.open(&ancient), Err(OpenError::UnknownKey(_))));
}

#[test]
fn rekey_is_due_after_the_volume_or_the_time() {
    let (mut a, _) = ports(5);
    let r = Rekey {
        bytes: 1000,
        after: Duration::from_secs(60),
    };
    assert!(!a.rekey_due(Instant::ZERO, &r));
    assert!(a.rekey_due(Instant::ZERO + Duration::from_secs(60), &r));
    for _ in 0..9 {
        a.seal(&[0; 100]);
    }
    assert!(!a.rekey_due(Instant::ZERO, &r));
    a.seal(&[0; 100]);
    assert!(a.rekey_due(Instant::ZERO, &r));
    assert_eq!(
        a.rekey_at(&r),
        Some(Instant::ZERO + Duration::from_secs(60))
    );
}

#[test]
fn no_key_means_nothing_sealed_and_clear_frames_are_marked() {
    let mut p = PortCrypto::new();
    assert!(p.seal(b"x").is_none());
    assert_eq!(p.counters.no_key_out, 1);
    let c = p.clear(b"hello");
    assert_eq!(c[0], CLEAR);
    assert_eq!(p.open(&c), Ok(Opened::Clear(b"hello")));
    assert_eq!(p.open(&[]), Err(OpenError::Truncated));
    assert_eq!(p.open(&[0x55, 1]), Err(OpenError::BadMarker(0x55)));
    assert_eq!(p.open(&[SEALED; 10]), Err(OpenError::Truncated));
    assert!(matches!(
        p.open(&[SEALED; 40]),
        Err(OpenError::UnknownKey(_))
    ));
    assert_eq!(p.counters.malformed, 3);
}

proptest::proptest! {
    #[test]
    fn open_never_panics(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..200)) {
        let (_, mut b) = ports(6);
        let _ = b.open(&bytes);
    }
}

#[test]
fn open_buf_decrypts_in_place_and_counts_like_open() {
    let (mut a, mut b) = ports(11);
    let msg = b"a frame opened where it lies".to_vec();
    let mut frame = PduBuf::with_room(SEALED_HEADER, &msg, TAG_LEN);
    assert!(a.seal_buf(&mut frame));
    let sealed = frame.to_vec();
    let before = crate::buf::stats();
    assert_eq!(b.open_buf(&mut frame), Ok(OpenedKind::Sealed));
    assert_eq!(&frame[..], &msg[..]);
    assert_eq!(crate::buf::stats(), before, "opened without a copy");
    assert_eq!(b.counters.opened, 1);
    // A replay of it is refused, and so is a tampered copy.
    let mut again = PduBuf::from(sealed.clone());
    assert_eq!(b.open_buf(&mut again), Err(OpenError::Replayed(0)));
    let mut bad = sealed;
    bad[SEALED_HEADER] ^= 1;
    let (_, mut fresh) = ports(11);
    assert_eq!(
        fresh.open_buf(&mut PduBuf::from(bad)),
        Err(OpenError::BadTag)
    );
    // A clear frame loses its marker in place.
    let mut clear = PduBuf::with_headroom(b"hello");
    a.clear_buf(&mut clear);
    assert_eq!(b.open_buf(&mut clear), Ok(OpenedKind::Clear));
    assert_eq!(&clear[..], b"hello");
    assert_eq!(b.counters.clear_in, 1);
}
