//! The flooded database alone, with a toy object and explicit time.

use super::*;

/// A toy object: key, sequence number, age.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Obj {
    key: u32,
    seq: u64,
    age: u32,
}

impl Flooded for Obj {
    type Key = u32;
    fn key(&self) -> u32 {
        self.key
    }
    fn seq(&self) -> u64 {
        self.seq
    }
    fn age(&self) -> u32 {
        self.age
    }
    fn with_age(&self, age: u32) -> Self {
        Obj {
            age,
            ..self.clone()
        }
    }
}

fn obj(key: u32, seq: u64, age: u32) -> Obj {
    Obj { key, seq, age }
}

fn secs(n: u64) -> Instant {
    Instant::from_nanos(n * 1_000_000_000)
}

fn ms(n: u64) -> Instant {
    Instant::from_nanos(n * 1_000_000)
}

fn db(max_objects: usize) -> FloodDb<Obj, u8> {
    FloodDb::new(Limits {
        max_age: Duration::from_secs(60),
        propagation_delay: Duration::from_millis(100),
        max_per_message: 2,
        max_objects,
    })
}

/// Peers 1, 2, 3 on ports 10, 20, 30.
fn peers() -> BTreeMap<u8, PortId> {
    [(1, 10), (2, 20), (3, 30)].into_iter().collect()
}

#[test]
fn newer_replaces_equal_is_duplicate_older_is_stale_and_full_refuses_new_keys() {
    let mut d = db(2);
    assert_eq!(d.judge(&obj(1, 5, 0)), Verdict::Accept);
    assert_eq!(d.store(secs(0), obj(1, 5, 0), Some(1)), None);
    assert_eq!(d.judge(&obj(1, 5, 0)), Verdict::Duplicate);
    assert_eq!(d.judge(&obj(1, 4, 0)), Verdict::Stale);
    assert_eq!(d.judge(&obj(1, 6, 0)), Verdict::Accept);
    assert_eq!(d.store(secs(0), obj(1, 6, 0), Some(1)), Some(obj(1, 5, 0)));
    d.store(secs(0), obj(2, 1, 0), None);
    // Full: a new key is refused, a newer copy of a stored one is not.
    assert_eq!(d.judge(&obj(3, 1, 0)), Verdict::Full);
    assert_eq!(d.judge(&obj(2, 2, 0)), Verdict::Accept);
    assert!(d.too_old(&obj(4, 1, 60)));
    assert!(!d.too_old(&obj(4, 1, 59)));
}

#[test]
fn a_flood_skips_the_peer_a_copy_came_from_and_waits_for_the_propagation_delay() {
    let mut d = db(100);
    d.store(ms(0), obj(1, 1, 0), Some(1));
    d.store(ms(0), obj(2, 1, 0), Some(1));
    d.store(ms(0), obj(3, 1, 0), Some(1));
    d.store(ms(0), obj(4, 1, 0), None);
    assert!(d.flush_due(ms(0)), "a first flood leaves at once");
    let out = d.flush(ms(0), &peers());
    // Own object to everyone; the three from peer 1 to 2 and 3, two per
    // message.
    assert_eq!(
        out,
        vec![
            Message {
                to_ports: vec![10, 20, 30],
                objects: vec![obj(4, 1, 0)],
            },
            Message {
                to_ports: vec![20, 30],
                objects: vec![obj(1, 1, 0), obj(2, 1, 0)],
            },
            Message {
                to_ports: vec![20, 30],
                objects: vec![obj(3, 1, 0)],
            },
        ]
    );
    // The next change waits for the propagation delay after that flood.
    d.store(ms(30), obj(5, 1, 0), None);
    assert!(!d.flush_due(ms(99)));
    assert_eq!(d.poll_timeout(), Some(ms(100)));
    assert!(d.flush_due(ms(100)));
    assert_eq!(d.flush(ms(100), &peers()).len(), 1);
    assert!(d.flush(ms(200), &peers()).is_empty(), "nothing pending");
}

#[test]
fn a_sync_leaves_out_what_the_next_flood_brings_the_new_peer() {
    let mut d = db(100);
    d.store(secs(0), obj(1, 1, 0), None);
    d.flush(secs(0), &peers());
    d.store(secs(1), obj(2, 1, 0), Some(2)); // pending, not for peer 2
    d.store(secs(1), obj(3, 1, 0), None); // pending, for everyone
                                          // Peer 3 (new) gets the flooded one now, the other two by the flood;
                                          // peer 2 also gets what came from it, since no flood will.
    let three = d.sync(secs(5), 3);
    assert_eq!(three, vec![vec![obj(1, 1, 5)]]);
    let two = d.sync(secs(5), 2);
    assert_eq!(two, vec![vec![obj(1, 1, 5), obj(2, 1, 4)]]);
}

#[test]
fn objects_age_by_whole_seconds_and_expire_at_the_maximum_age_less_their_age() {
    let mut d = db(100);
    d.store(secs(0), obj(1, 1, 10), None);
    d.store(secs(0), obj(2, 1, 0), None);
    assert_eq!(d.get(&1).map(|s| s.at(ms(1_999))), Some(obj(1, 1, 11)));
    assert_eq!(d.poll_timeout(), Some(secs(0)), "the flood is due");
    d.flush(secs(0), &peers());
    assert_eq!(d.poll_timeout(), Some(secs(50)));
    assert!(d.expire(ms(49_999)).is_empty());
    assert_eq!(d.expire(secs(50)), vec![obj(1, 1, 10)]);
    assert_eq!(d.len(), 1);
    assert_eq!(d.poll_timeout(), Some(secs(60)));
    // A refreshed copy (newer sequence number) lives a full life again.
    d.store(secs(55), obj(2, 2, 0), None);
    assert!(d.expire(secs(60)).is_empty());
    assert_eq!(d.expire(secs(115)), vec![obj(2, 2, 0)]);
    assert!(d.is_empty());
}

#[test]
fn an_expired_object_is_not_flooded() {
    let mut d = db(100);
    d.store(secs(0), obj(1, 1, 59), None);
    assert_eq!(d.expire(secs(1)).len(), 1);
    assert!(d.flush(secs(1), &peers()).is_empty());
}

#[test]
fn what_came_from_a_peer_that_left_goes_to_every_peer() {
    let mut d = db(100);
    d.store(secs(0), obj(1, 1, 0), Some(1));
    d.forget_peer(1);
    let out = d.flush(secs(0), &peers());
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].to_ports, vec![10, 20, 30]);
}

#[test]
fn sequence_numbers_compare_and_wrap_in_serial_arithmetic() {
    assert!(seq_newer(6, 5, 64) && !seq_newer(5, 6, 64) && !seq_newer(5, 5, 64));
    // After the top comes 1, and it is newer.
    assert_eq!(seq_next(u64::MAX, 64), 1);
    assert!(seq_newer(1, u64::MAX, 64));
    assert_eq!(seq_next(u64::from(u32::MAX), 32), 1);
    assert!(seq_newer(1, u64::from(u32::MAX), 32));
    assert_eq!(seq_next(7, 32), 8);
    // Up to just under half the space ahead is newer; half is neither.
    assert!(seq_newer((1 << 31) - 1, 0, 32));
    assert!(!seq_newer(1 << 31, 0, 32) && !seq_newer(0, 1 << 31, 32));
    assert!(seq_newer(1 << 63, 1, 64));
    assert!(!seq_newer(1 << 63, 0, 64) && !seq_newer(0, 1 << 63, 64));
}

#[test]
fn expiries_follow_updates_and_each_expiry_takes_only_what_is_due() {
    let mut d = db(100);
    d.store(secs(0), obj(1, 1, 0), None);
    d.flush(secs(0), &peers());
    assert_eq!(d.poll_timeout(), Some(secs(60)));
    // A newer copy lives a full life from now: the timer moves with it
    // (no wake-up at the old copy's expiry).
    d.store(secs(30), obj(1, 2, 0), None);
    d.flush(secs(30), &peers());
    assert_eq!(d.poll_timeout(), Some(secs(90)));
    // Objects stored a second apart, keys in reverse order: each expiry
    // takes those due, in key order, and the timer goes to the next.
    for i in 0..10u32 {
        d.store(secs(31 + u64::from(i)), obj(100 - i, 1, 0), None);
    }
    d.flush(secs(41), &peers());
    assert_eq!(d.poll_timeout(), Some(secs(90)));
    assert_eq!(d.expire(secs(90)), vec![obj(1, 2, 0)]);
    assert_eq!(d.poll_timeout(), Some(secs(91)));
    let keys = |v: Vec<Obj>| v.into_iter().map(|o| o.key).collect::<Vec<_>>();
    assert_eq!(keys(d.expire(secs(91))), vec![100]);
    assert_eq!(keys(d.expire(secs(94))), vec![97, 98, 99]);
    assert_eq!(d.poll_timeout(), Some(secs(95)));
    assert_eq!(d.len(), 6);
    assert_eq!(keys(d.expire(secs(1000))), vec![91, 92, 93, 94, 95, 96]);
    assert!(d.is_empty());
    assert_eq!(d.poll_timeout(), None);
}
