//! Unit tests of the QoS scheduling policies, with the figures of seeds 003
//! and 004 where the papers give them.

use super::*;
use crate::time::Instant;
use std::collections::BTreeMap;
use std::time::Duration;

const T0: Instant = Instant::ZERO;
const MB: u64 = 1_000_000;

fn ms(n: u64) -> Instant {
    Instant::from_nanos(n * 1_000_000)
}

fn pdu(qos_id: u64, len: usize) -> QueuedPdu {
    QueuedPdu {
        qos_id,
        mgmt: false,
        bytes: vec![qos_id as u8; len].into(),
    }
}

fn mgmt() -> QueuedPdu {
    QueuedPdu {
        qos_id: 0,
        mgmt: true,
        bytes: vec![0xee; 10].into(),
    }
}

/// Large enough not to cap anything in a test.
fn level(rate_bps: u64) -> LevelLimit {
    LevelLimit {
        rate_bps,
        max_backlog_bytes: 1 << 30,
    }
}

fn capped(max_backlog_bytes: u64) -> LevelLimit {
    LevelLimit {
        rate_bps: 0,
        max_backlog_bytes,
    }
}

fn stat<'a>(s: &'a [QueueStats], name: &str) -> &'a QueueStats {
    s.iter()
        .find(|q| q.queue == name)
        .unwrap_or_else(|| panic!("no queue {name} in {s:?}"))
}

// ---------------------------------------------------------------- credits

#[test]
fn one_millisecond_gives_the_credit_of_seed_004() {
    // Fig. 6 limits on a 100 Mb/s link: urgency A 18 %, B 31 %, C 51 %.
    let mut c = Credits::new(&[level(18 * MB), level(31 * MB), level(51 * MB)]);
    c.gain_for(Duration::from_millis(1));
    assert_eq!(c.bits(), vec![18_000, 31_000, 51_000]);

    // The same through the policy: credit counts from the first call.
    let cfg = RateLimitConfig {
        urgency: vec![level(18 * MB), level(31 * MB), level(51 * MB)],
        cherish: vec![level(100 * MB)],
        queue_len: 10,
        cherish_thresholds: vec![],
        mgmt_queue_len: 10,
    };
    let cu = CuMap::new().with(1, 0, 0).with(2, 1, 0).with(3, 2, 0);
    let mut r = RateLimit2d::new(cfg, cu);
    r.create_queues(1);
    assert_eq!(r.next_to_send(T0, 1), None);
    assert_eq!(r.next_to_send(ms(1), 1), None);
    assert_eq!(r.credits(1).unwrap().0.bits(), vec![18_000, 31_000, 51_000]);
}

#[test]
fn only_levels_from_the_first_positive_one_are_servable() {
    let mut c = Credits::new(&[level(1), level(1), level(1), level(1)]);
    c.set_bits(&[0, -5, 20, 50]);
    assert_eq!(c.first_positive(), Some(2));
    let servable: Vec<bool> = (0..4).map(|l| c.allows(l)).collect();
    assert_eq!(servable, vec![false, false, true, true]);
    c.set_bits(&[0, 0, 0, -1]);
    assert!((0..4).all(|l| !c.allows(l)), "no credit anywhere");
}

#[test]
fn consumption_borrows_from_more_urgent_levels_nearest_first() {
    let mut c = Credits::new(&[level(1), level(1), level(1)]);
    c.set_bits(&[100, 10, 0]);
    c.consume_bits(2, 50);
    assert_eq!(c.bits(), vec![60, 0, 0], "10 from level 1, 40 from level 0");
    // Enough at the own level: nothing borrowed.
    c.set_bits(&[100, 10, 30]);
    c.consume_bits(2, 30);
    assert_eq!(c.bits(), vec![100, 10, 0]);
    // Never from less urgent levels.
    c.set_bits(&[0, 5, 100]);
    c.consume_bits(1, 20);
    assert_eq!(c.bits(), vec![0, -15, 100]);
}

#[test]
fn consumption_leaves_the_own_level_negative_only_when_upper_levels_are_dry() {
    let mut c = Credits::new(&[level(1), level(1), level(1)]);
    c.set_bits(&[20, 0, 5]);
    c.consume_bits(2, 50);
    assert_eq!(c.bits(), vec![0, 0, -25]);
    // A level in debt above is not "borrowed" from (the pseudo-code would
    // wipe its debt and give [0, 0, 0]; the prose keeps it).
    c.set_bits(&[30, -10, 0]);
    c.consume_bits(2, 20);
    assert_eq!(c.bits(), vec![10, -10, 0]);
}

#[test]
fn gains_repay_negative_levels_first() {
    let mut c = Credits::new(&[level(1), level(1), level(1)]);
    // Level 0's gain pays the debts of the levels that may borrow from it,
    // the least urgent first, and keeps only what is left.
    c.set_bits(&[0, -10, -10]);
    c.gain_bits(&[15, 0, 0]);
    assert_eq!(c.bits(), vec![0, -5, 0]);
    c.gain_bits(&[15, 0, 0]);
    assert_eq!(c.bits(), vec![10, 0, 0]);
    // Each level's own gain goes to its own debt first; a more urgent
    // level's gain repays what is still owed below it.
    c.set_bits(&[0, -30, -10]);
    c.gain_bits(&[20, 5, 15]);
    assert_eq!(c.bits(), vec![0, -5, 5]);
    // A less urgent level's gain never repays a more urgent level's debt.
    c.set_bits(&[-10, 0, 0]);
    c.gain_bits(&[0, 0, 40]);
    assert_eq!(c.bits(), vec![-10, 0, 40]);
}

#[test]
fn backlog_cap_passes_the_surplus_down() {
    // Maximum backlogs of 1000, 2000 and 3000 bits.
    let mut c = Credits::new(&[capped(125), capped(250), capped(375)]);
    c.gain_bits(&[1500, 1900, 0]);
    assert_eq!(c.bits(), vec![1000, 2000, 400]);
    // The least urgent level's surplus is lost.
    c.gain_bits(&[0, 0, 5000]);
    assert_eq!(c.bits(), vec![1000, 2000, 3000]);
    // Surplus passes level by level.
    c.set_bits(&[0, 0, 0]);
    c.gain_bits(&[4000, 0, 0]);
    assert_eq!(c.bits(), vec![1000, 2000, 1000]);
}

// ------------------------------------------------------- rate-limit-2d

/// Seed 004's test set-up: 3 x 3 matrix, Table 3 limits on 100 Mb/s, the
/// seven cubes of Table 2 (A1 = 11, A2 = 12, B1 = 21, … C3 = 33).
fn seed004_rlim() -> RateLimit2d {
    let lim = |r: u64| LevelLimit {
        rate_bps: r * MB,
        max_backlog_bytes: 15_000,
    };
    let cfg = RateLimitConfig {
        urgency: vec![lim(15), lim(45), lim(40)],
        cherish: vec![lim(15), lim(45), lim(40)],
        queue_len: 1000,
        cherish_thresholds: vec![1000, 1000, 100],
        mgmt_queue_len: 10,
    };
    let mut cu = CuMap::new();
    for (u, c) in [(0, 0), (0, 1), (1, 0), (1, 1), (1, 2), (2, 1), (2, 2)] {
        cu.insert(10 * (u as u64 + 1) + c as u64 + 1, CuCell::new(u, c));
    }
    let mut r = RateLimit2d::new(cfg, cu);
    r.create_queues(1);
    r
}

#[test]
fn rate_limiter_serves_the_most_urgent_cell_with_credit_in_both_dimensions() {
    let mut r = seed004_rlim();
    for q in [33, 22, 11, 21] {
        r.enqueue(T0, 1, pdu(q, 100)).unwrap();
    }
    // No credit yet: declines, and says when to come back.
    assert_eq!(r.next_to_send(T0, 1), None);
    let wake = r.next_wakeup(1).unwrap();
    assert!(wake > T0 && wake < ms(1), "{wake:?}");
    let (u, c) = r.credits_mut(1).unwrap();
    u.set_bits(&[0, 5000, 5000]);
    c.set_bits(&[5000, 5000, 5000]);
    // Urgency A has no credit: B2 came before B1.
    let first = r.next_to_send(T0, 1).unwrap();
    assert_eq!(first.qos_id, 22, "oldest of the most urgent servable level");
    assert_eq!(r.next_to_send(T0, 1).unwrap().qos_id, 21);
    assert_eq!(r.next_to_send(T0, 1).unwrap().qos_id, 33);
    // A1 needs urgency-0 credit.
    assert_eq!(r.next_to_send(T0, 1), None);
    let (u, _) = r.credits_mut(1).unwrap();
    u.set_bits(&[1, 0, 0]);
    assert_eq!(r.next_to_send(T0, 1).unwrap().qos_id, 11);
    let (u, c) = r.credits(1).unwrap();
    assert_eq!(u.bits(), vec![-799, 0, 0], "100 bytes charged, 1 bit there");
    assert_eq!(c.bits(), vec![5000 - 2 * 800, 5000 - 800, 5000 - 800]);
}

#[test]
fn rate_limiter_cherish_dimension_blocks_too() {
    let mut r = seed004_rlim();
    r.enqueue(T0, 1, pdu(11, 100)).unwrap();
    r.enqueue(T0, 1, pdu(12, 100)).unwrap();
    let (u, c) = r.credits_mut(1).unwrap();
    u.set_bits(&[5000, 0, 0]);
    c.set_bits(&[0, 5000, 0]);
    assert_eq!(
        r.next_to_send(T0, 1).unwrap().qos_id,
        12,
        "A1 has no cherish credit"
    );
    assert_eq!(r.next_to_send(T0, 1), None);
    let s = r.stats(1);
    assert_eq!((stat(&s, "A1").queued, stat(&s, "A2").sent), (1, 1));
}

#[test]
fn rate_limiter_wakes_up_when_credit_allows_and_drops_over_its_bound() {
    let mut r = seed004_rlim();
    r.enqueue(T0, 1, mgmt()).unwrap();
    r.enqueue(T0, 1, pdu(11, 1000)).unwrap();
    assert!(
        r.next_to_send(T0, 1).unwrap().mgmt,
        "management first, free"
    );
    assert_eq!(r.next_to_send(T0, 1), None);
    // Any positive credit will do (the PDU may leave the level negative):
    // the first nanosecond gives urgency 0 and cherish 0 some.
    let wake = r.next_wakeup(1).unwrap();
    assert_eq!(wake, Instant::from_nanos(1));
    assert!(r.next_to_send(wake, 1).is_some());
    // queue_len bounds each cell, cherish_thresholds lower it.
    for _ in 0..1000 {
        r.enqueue(wake, 1, pdu(32, 10)).unwrap();
    }
    assert!(r.enqueue(wake, 1, pdu(32, 10)).is_err());
    for _ in 0..100 {
        r.enqueue(wake, 1, pdu(33, 10)).unwrap();
    }
    assert!(r.enqueue(wake, 1, pdu(33, 10)).is_err());
    r.enqueue(wake, 1, pdu(22, 10)).unwrap();
    let s = r.stats(1);
    let c2 = stat(&s, "C2");
    assert_eq!((c2.queued, c2.dropped, c2.max_occupancy), (1000, 1, 1000));
    assert_eq!((stat(&s, "C3").queued, stat(&s, "C3").dropped), (100, 1));
}

// -------------------------------------------------------------- QTA-Mux

/// Seed 003's MR DIF: 2 x 2 matrix, A1 = 1, A2 = 2, B1 = 3, B2 = 4.
fn mr_map() -> CuMap {
    CuMap::new()
        .with(1, 0, 0)
        .with(2, 0, 1)
        .with(3, 1, 0)
        .with(4, 1, 1)
}

fn qta(cfg: QtaMuxConfig, cu: &CuMap) -> Box<dyn Scheduler> {
    let mut s = SchedulerConfig::QtaMux(cfg).build(cu).unwrap();
    s.create_queues(1);
    s
}

#[test]
fn qta_mux_serves_by_urgency_management_first() {
    let mut q = qta(QtaMuxConfig::new(vec![100, 100]), &mr_map());
    q.enqueue(T0, 1, pdu(3, 10)).unwrap();
    q.enqueue(T0, 1, pdu(4, 10)).unwrap();
    q.enqueue(T0, 1, pdu(2, 10)).unwrap();
    q.enqueue(T0, 1, mgmt()).unwrap();
    q.enqueue(T0, 1, pdu(1, 10)).unwrap();
    let order: Vec<_> = std::iter::from_fn(|| q.next_to_send(T0, 1))
        .map(|p| if p.mgmt { 0 } else { p.qos_id })
        .collect();
    assert_eq!(order, vec![0, 2, 1, 3, 4], "mgmt, then A FIFO, then B FIFO");
    let s = q.stats(1);
    assert_eq!(stat(&s, "urgency-A").sent, 2);
    assert_eq!(stat(&s, "urgency-B").max_occupancy, 2);
    assert_eq!(stat(&s, "qos-4 (B2)").sent, 1);
}

#[test]
fn qta_mux_drops_by_cherish_threshold_on_the_shared_buffer() {
    // Cherish 0 may fill 4 PDUs, cherish 1 only 2.
    let mut q = qta(QtaMuxConfig::new(vec![4, 2]), &mr_map());
    let ok = |q: &mut Box<dyn Scheduler>, id| q.enqueue(T0, 1, pdu(id, 10)).is_ok();
    assert!(ok(&mut q, 4) && ok(&mut q, 3));
    assert!(
        !ok(&mut q, 2),
        "A2 (cherish 1) refused at occupancy 2, though urgent"
    );
    assert!(ok(&mut q, 1) && ok(&mut q, 3));
    assert!(!ok(&mut q, 1), "A1 refused at 4");
    let s = q.stats(1);
    assert_eq!(
        (
            stat(&s, "qos-2 (A2)").dropped,
            stat(&s, "qos-1 (A1)").dropped
        ),
        (1, 1)
    );
    assert_eq!(stat(&s, "urgency-B").max_occupancy, 3);
}

#[test]
fn qta_mux_can_compare_thresholds_with_the_urgency_queue() {
    let mut cfg = QtaMuxConfig::new(vec![4, 2]);
    cfg.occupancy = Occupancy::Urgency;
    // Seed 003 sets thresholds per cube: B2 keeps 3 although cherish 1.
    cfg.cube_mut(4).threshold = Some(3);
    let mut q = qta(cfg, &mr_map());
    for _ in 0..3 {
        q.enqueue(T0, 1, pdu(3, 10)).unwrap();
    }
    assert!(q.enqueue(T0, 1, pdu(4, 10)).is_err(), "B queue at 3");
    assert!(q.enqueue(T0, 1, pdu(2, 10)).is_ok(), "A queue empty");
    assert!(q.enqueue(T0, 1, pdu(2, 10)).is_ok());
    assert!(q.enqueue(T0, 1, pdu(2, 10)).is_err(), "A queue at 2");
}

#[test]
fn qta_mux_skips_the_most_urgent_level_with_the_configured_probability() {
    let run = |seed: u64| {
        let mut cfg = QtaMuxConfig::new(vec![100_000, 100_000]);
        cfg.skip_probability = 0.25;
        cfg.seed = seed;
        let mut q = qta(cfg, &mr_map());
        let mut served = Vec::new();
        for _ in 0..20_000 {
            // Keep both levels non-empty.
            q.enqueue(T0, 1, pdu(1, 10)).unwrap();
            q.enqueue(T0, 1, pdu(3, 10)).unwrap();
            served.push(q.next_to_send(T0, 1).unwrap().qos_id);
        }
        served
    };
    let a = run(7);
    let low = a.iter().filter(|&&q| q == 3).count() as f64 / a.len() as f64;
    assert!((low - 0.25).abs() < 0.02, "least urgent served {low}");
    assert_eq!(a, run(7), "same seed, same draws");
    assert_ne!(a, run(8));
    // With nothing else queued the most urgent level is never skipped.
    let mut cfg = QtaMuxConfig::new(vec![100, 100]);
    cfg.skip_probability = 1.0;
    let mut q = qta(cfg, &mr_map());
    q.enqueue(T0, 1, pdu(1, 10)).unwrap();
    assert_eq!(q.next_to_send(T0, 1).unwrap().qos_id, 1);
    // Probability 1: always the next level when there is one.
    q.enqueue(T0, 1, pdu(1, 10)).unwrap();
    q.enqueue(T0, 1, pdu(3, 10)).unwrap();
    assert_eq!(q.next_to_send(T0, 1).unwrap().qos_id, 3);
}

#[test]
fn qta_mux_policer_drops_beyond_the_cube_rate() {
    let mut cfg = QtaMuxConfig::new(vec![100, 100]);
    // 8 kb/s, 1000-byte bucket; 500-byte PDUs.
    cfg.cube_mut(1).limit = Some(BucketParams {
        rate_bps: 8_000,
        burst_bytes: 1000,
    });
    let mut q = qta(cfg, &mr_map());
    let res: Vec<bool> = (0..3)
        .map(|_| q.enqueue(T0, 1, pdu(1, 500)).is_ok())
        .collect();
    assert_eq!(res, vec![true, true, false], "a burst of 1000 bytes");
    assert!(q.enqueue(ms(499), 1, pdu(1, 500)).is_err());
    assert!(
        q.enqueue(ms(500), 1, pdu(1, 500)).is_ok(),
        "500 bytes in 0.5 s"
    );
    assert!(
        q.enqueue(ms(500), 1, pdu(2, 500)).is_ok(),
        "other cubes unaffected"
    );
    let s = q.stats(1);
    assert_eq!(stat(&s, "qos-1 (A1)").dropped, 2);
    assert_eq!(stat(&s, "qos-1 (A1)").queued, 3);
}

#[test]
fn qta_mux_shaper_delays_beyond_the_cube_rate() {
    let mut cfg = QtaMuxConfig::new(vec![100, 100]);
    let c = cfg.cube_mut(3);
    c.limit = Some(BucketParams {
        rate_bps: 8_000,
        burst_bytes: 1000,
    });
    c.excess = Excess::Delay;
    c.shaper_queue_len = 3;
    let mut q = qta(cfg, &mr_map());
    for _ in 0..5 {
        q.enqueue(T0, 1, pdu(3, 500)).unwrap();
    }
    assert!(
        q.enqueue(T0, 1, pdu(3, 500)).is_err(),
        "shaper queue of 3 full"
    );
    assert!(q.next_to_send(T0, 1).is_some());
    assert!(q.next_to_send(T0, 1).is_some());
    assert_eq!(q.next_to_send(T0, 1), None, "shaped");
    assert!(q.has_queued(1));
    assert_eq!(q.next_wakeup(1), Some(ms(500)));
    assert_eq!(q.next_to_send(ms(499), 1), None);
    assert!(q.next_to_send(ms(500), 1).is_some());
    assert_eq!(q.next_wakeup(1), Some(ms(1000)));
    let s = q.stats(1);
    let b1 = stat(&s, "qos-3 (B1)");
    assert_eq!(
        (b1.sent, b1.queued, b1.dropped, b1.max_occupancy),
        (3, 2, 1, 5)
    );
    // The two still shaped leave at 1 s and 1.5 s; then nothing is queued
    // and nothing is to wake for.
    assert!(q.next_to_send(ms(1000), 1).is_some());
    assert!(q.has_queued(1));
    assert_eq!(q.next_wakeup(1), Some(ms(1500)));
    assert!(q.next_to_send(ms(1500), 1).is_some());
    assert!(!q.has_queued(1));
    assert_eq!(q.next_wakeup(1), None);
    assert_eq!(q.next_to_send(ms(5000), 1), None);
}

#[test]
fn qta_mux_puts_unknown_qos_ids_in_the_default_cell() {
    let mut q = qta(QtaMuxConfig::new(vec![100, 100]), &mr_map());
    q.enqueue(T0, 1, pdu(99, 10)).unwrap();
    q.enqueue(T0, 1, pdu(98, 10)).unwrap();
    q.enqueue(T0, 1, pdu(1, 10)).unwrap();
    assert_eq!(q.next_to_send(T0, 1).unwrap().qos_id, 1);
    let s = q.stats(1);
    assert_eq!(stat(&s, "qos-other (B2)").queued, 2);
    assert_eq!(
        s.len(),
        1 + 2 + 5,
        "mgmt, two urgency levels, 4 cubes + other"
    );
}

// ------------------------------------------------------------- DiffServ

#[test]
fn diffserv_polices_per_cherish_class_and_serves_in_arrival_order() {
    let cfg = DiffServConfig {
        classes: vec![
            DsClass {
                limit: Some(BucketParams {
                    rate_bps: 8_000,
                    burst_bytes: 1000,
                }),
            },
            DsClass { limit: None },
        ],
        queue_len: 100,
        mgmt_queue_len: 10,
    };
    let mut d = SchedulerConfig::Diffserv(cfg).build(&mr_map()).unwrap();
    d.create_queues(1);
    let mut ok = Vec::new();
    for id in [4, 1, 1, 1, 2, 2, 2] {
        ok.push(d.enqueue(T0, 1, pdu(id, 500)).is_ok());
    }
    assert_eq!(ok, vec![true, true, true, false, true, true, true]);
    let order: Vec<_> = std::iter::from_fn(|| d.next_to_send(T0, 1))
        .map(|p| p.qos_id)
        .collect();
    assert_eq!(order, vec![4, 1, 1, 2, 2, 2], "no urgency: arrival order");
    let s = d.stats(1);
    assert_eq!(
        (stat(&s, "cherish-1").sent, stat(&s, "cherish-1").dropped),
        (2, 1)
    );
    assert_eq!(stat(&s, "cherish-2").sent, 4);
}

// --------------------------------------------------------- token bucket

#[test]
fn token_bucket_polices_or_shapes_a_port() {
    let mk = |excess| {
        let mut s = SchedulerConfig::TokenBucket(TokenBucketConfig {
            rate_bps: 8_000,
            burst_bytes: 1000,
            excess,
            queue_len: 10,
        })
        .build(&CuMap::new())
        .unwrap();
        s.create_queues(1);
        for _ in 0..4 {
            let _ = s.enqueue(T0, 1, pdu(1, 500));
        }
        s
    };
    let mut police = mk(Excess::Drop);
    assert_eq!(stat(&police.stats(1), "bucket").dropped, 2);
    assert!(police.next_to_send(T0, 1).is_some() && police.next_to_send(T0, 1).is_some());
    assert!(!police.has_queued(1));
    let mut shape = mk(Excess::Delay);
    assert!(shape.next_to_send(T0, 1).is_some() && shape.next_to_send(T0, 1).is_some());
    assert_eq!(shape.next_to_send(T0, 1), None);
    assert_eq!(shape.next_wakeup(1), Some(ms(500)));
    assert!(shape.next_to_send(ms(500), 1).is_some());
    shape.enqueue(ms(500), 1, mgmt()).unwrap();
    assert!(
        shape.next_to_send(ms(500), 1).unwrap().mgmt,
        "management is not shaped"
    );
}

// --------------------------------------------------------------- config

#[test]
fn configs_deserialise_from_toml_and_json() {
    let t: SchedulerConfig = toml::from_str(
        r#"
        policy = "qta-mux"
        cherish_thresholds = [1250, 50]
        occupancy = "urgency"
        skip_probability = 0.05
        [[cubes]]
        qos_id = 4
        threshold = 1100
        [[cubes]]
        qos_id = 1
        limit = { rate_bps = 5000000, burst_bytes = 15000 }
        excess = "delay"
        "#,
    )
    .unwrap();
    let SchedulerConfig::QtaMux(q) = &t else {
        panic!("{t:?}")
    };
    assert_eq!(q.cubes.len(), 2);
    assert_eq!(q.cubes[1].excess, Excess::Delay);
    assert_eq!(t.build(&mr_map()).unwrap().name(), "qta-mux");

    let j: SchedulerConfig = serde_json::from_str(
        r#"{"policy": "rate-limit-2d",
            "urgency": [{"rate_bps": 15000000, "max_backlog_bytes": 15000},
                        {"rate_bps": 45000000, "max_backlog_bytes": 15000}],
            "cherish": [{"rate_bps": 60000000, "max_backlog_bytes": 15000}]}"#,
    )
    .unwrap();
    assert_eq!(
        j.build(&CuMap::new().with(1, 1, 0)).unwrap().name(),
        "rate-limit-2d"
    );
    let f: SchedulerConfig = toml::from_str("policy = \"fifo\"").unwrap();
    assert_eq!(f, SchedulerConfig::default());
    assert!(toml::from_str::<SchedulerConfig>("policy = \"fifo\"\nqueue_length = 3").is_err());
    assert!(toml::from_str::<SchedulerConfig>("policy = \"wfq\"").is_err());
}

#[test]
fn bad_parameters_are_named() {
    let param = |c: SchedulerConfig, cu: &CuMap| match c.build(cu) {
        Err(SchedConfigError::BadParam { param, .. }) => param,
        Ok(s) => panic!("{} built", s.name()),
    };
    let mut q = QtaMuxConfig::new(vec![10, 10]);
    q.skip_probability = 1.5;
    assert_eq!(
        param(SchedulerConfig::QtaMux(q), &mr_map()),
        "skip_probability"
    );
    let q = QtaMuxConfig::new(vec![10]);
    assert_eq!(
        param(SchedulerConfig::QtaMux(q), &mr_map()),
        "cherish_thresholds"
    );
    let mut q = QtaMuxConfig::new(vec![10, 10]);
    q.cube_mut(3).limit = Some(BucketParams {
        rate_bps: 0,
        burst_bytes: 10,
    });
    assert_eq!(
        param(SchedulerConfig::QtaMux(q), &mr_map()),
        "cubes[0].limit.rate_bps"
    );
    let r = RateLimitConfig {
        urgency: vec![level(1)],
        cherish: vec![level(1), level(1)],
        queue_len: 10,
        cherish_thresholds: vec![],
        mgmt_queue_len: 10,
    };
    assert_eq!(param(SchedulerConfig::RateLimit2d(r), &mr_map()), "urgency");
    let d = DiffServConfig {
        classes: vec![],
        queue_len: 1,
        mgmt_queue_len: 1,
    };
    assert_eq!(param(SchedulerConfig::Diffserv(d), &mr_map()), "classes");
    assert_eq!(
        param(
            SchedulerConfig::Fifo(FifoConfig { queue_len: 0 }),
            &mr_map()
        ),
        "queue_len"
    );
    let e = SchedulerConfig::Fifo(FifoConfig { queue_len: 0 })
        .build(&mr_map())
        .unwrap_err();
    assert!(
        e.to_string().contains("fifo") && e.to_string().contains("queue_len"),
        "{e}"
    );
}

#[test]
fn the_rmt_switches_policies_at_runtime() {
    let mut r = Rmt::new(SchedulerConfig::default().build(&mr_map()).unwrap());
    r.add_port(1);
    r.table_mut().set(7, None, vec![1]);
    r.send(T0, 7, 0, pdu(3, 10)).unwrap();
    r.set_scheduler(
        SchedulerConfig::QtaMux(QtaMuxConfig::new(vec![10, 10]))
            .build(&mr_map())
            .unwrap(),
    );
    assert_eq!(r.scheduler_name(), "qta-mux");
    assert_eq!(r.counters().queue_drops, 1, "the FIFO's PDU is discarded");
    r.send(T0, 7, 0, pdu(3, 10)).unwrap();
    r.send(T0, 7, 0, pdu(1, 10)).unwrap();
    assert_eq!(r.poll_output(T0, 1).unwrap()[0], 1, "urgent first");
    let s = r.queue_stats(1);
    assert_eq!(stat(&s, "qos-3 (B1)").queued, 1);
}

// ------------------------------------------------------------ robustness

fn all_policies() -> Vec<SchedulerConfig> {
    let b = |r| {
        Some(BucketParams {
            rate_bps: r,
            burst_bytes: 3000,
        })
    };
    let mut qta = QtaMuxConfig::new(vec![20, 5]);
    qta.skip_probability = 0.3;
    qta.cube_mut(1).limit = b(1_000_000);
    qta.cube_mut(3).limit = b(2_000_000);
    qta.cube_mut(3).excess = Excess::Delay;
    qta.cube_mut(3).shaper_queue_len = 4;
    let mut qta_u = qta.clone();
    qta_u.occupancy = Occupancy::Urgency;
    let lim = |r| LevelLimit {
        rate_bps: r,
        max_backlog_bytes: 3000,
    };
    vec![
        SchedulerConfig::Fifo(FifoConfig { queue_len: 10 }),
        SchedulerConfig::TokenBucket(TokenBucketConfig {
            rate_bps: 1_000_000,
            burst_bytes: 3000,
            excess: Excess::Delay,
            queue_len: 10,
        }),
        SchedulerConfig::QtaMux(qta),
        SchedulerConfig::QtaMux(qta_u),
        SchedulerConfig::RateLimit2d(RateLimitConfig {
            urgency: vec![lim(1_000_000), lim(0)],
            cherish: vec![lim(500_000), lim(2_000_000)],
            queue_len: 8,
            cherish_thresholds: vec![8, 3],
            mgmt_queue_len: 3,
        }),
        SchedulerConfig::Diffserv(DiffServConfig {
            classes: vec![
                DsClass {
                    limit: b(1_000_000),
                },
                DsClass { limit: None },
            ],
            queue_len: 10,
            mgmt_queue_len: 3,
        }),
    ]
}

proptest::proptest! {
    /// Whatever arrives (any QoS-id, any size, management or not, at any
    /// pace), no policy panics, none hands out more PDUs than it took, and
    /// given time every policy drains.
    #[test]
    fn policies_survive_any_input_and_drain(
        ops in proptest::collection::vec(
            (0u64..8, 0usize..4000, proptest::bool::weighted(0.1), 0u64..2_000_000, proptest::bool::ANY),
            1..200,
        )
    ) {
        for cfg in all_policies() {
            let mut s = cfg.build(&mr_map()).unwrap();
            s.create_queues(1);
            let (mut now, mut accepted, mut sent) = (0u64, 0u64, 0u64);
            for &(qos_id, len, is_mgmt, dt, poll) in &ops {
                now += dt;
                let t = Instant::from_nanos(now);
                let p = QueuedPdu { qos_id, mgmt: is_mgmt, bytes: vec![0; len].into() };
                if s.enqueue(t, 1, p).is_ok() {
                    accepted += 1;
                }
                if poll {
                    sent += s.next_to_send(t, 1).is_some() as u64;
                }
                let _ = s.stats(1);
                let _ = s.next_wakeup(1);
            }
            let mut guard = 0;
            while s.has_queued(1) {
                guard += 1;
                proptest::prop_assert!(guard < 10_000, "{} does not drain", s.name());
                let t = Instant::from_nanos(now);
                match s.next_to_send(t, 1) {
                    Some(_) => sent += 1,
                    None => {
                        let w = s.next_wakeup(1);
                        proptest::prop_assert!(w.is_some(), "{} holds PDUs with no wake-up", s.name());
                        now = now.max(w.unwrap().as_nanos()).max(now + 1);
                    }
                }
            }
            proptest::prop_assert!(sent <= accepted, "{}: {sent} sent of {accepted}", s.name());
            if cfg.name() != "qta-mux" {
                // Only QTA-Mux may drop a PDU it accepted (a shaped PDU the
                // mux refuses later); the others send all they took.
                proptest::prop_assert_eq!(sent, accepted, "{}", s.name());
            }
            proptest::prop_assert_eq!(s.destroy_queues(1), 0);
        }
    }
}

// ---------------------------------------------------------------- paced ports

/// Mean and largest queueing delay (ms) per QoS-id, and drops per QoS-id,
/// of 2 s of traffic through one port paced at 10 Mb/s: QoS-id 1 sends a
/// 1000-byte PDU every 8 ms (1 Mb/s), QoS-id 2 one every 0.66 ms (12 Mb/s,
/// more than the port carries). PDUs carry their enqueue time and QoS-id.
fn paced_port_delays(sched: &SchedulerConfig) -> BTreeMap<u64, (f64, f64, u64)> {
    let cu = CuMap::new().with(1, 0, 0).with(2, 1, 1);
    let mut rmt = Rmt::new(sched.build(&cu).unwrap());
    rmt.add_port(1);
    rmt.table_mut().set(9, None, vec![1]);
    rmt.set_port_rate(1, Some(PortRate::new(10 * MB)));
    let mut out: BTreeMap<u64, (f64, f64, u64, u64)> = BTreeMap::new();
    let step = 20_000; // 20 µs
    let (mut next_u, mut next_b) = (0u64, 0u64);
    let mut t = 0u64;
    while t < 2_000_000_000 {
        let now = Instant::from_nanos(t);
        for (q, next, gap) in [(1, &mut next_u, 8_000_000), (2, &mut next_b, 660_000)] {
            if t >= *next {
                *next += gap;
                let mut bytes = vec![0u8; 1000];
                bytes[..8].copy_from_slice(&t.to_be_bytes());
                bytes[8] = q as u8;
                let p = QueuedPdu {
                    qos_id: q,
                    mgmt: false,
                    bytes: bytes.into(),
                };
                if rmt.send(now, 9, 0, p).is_err() {
                    out.entry(q).or_default().3 += 1;
                }
            }
        }
        while let Some(b) = rmt.poll_output(now, 1) {
            let sent = u64::from_be_bytes(b[..8].try_into().unwrap());
            let qos = u64::from(b[8]);
            let d = (t - sent) as f64 / 1e6;
            let e = out.entry(qos).or_default();
            e.0 += d;
            e.1 = e.1.max(d);
            e.2 += 1;
        }
        t += step;
    }
    out.into_iter()
        .map(|(q, (sum, max, n, drops))| (q, (sum / n.max(1) as f64, max, drops)))
        .collect()
}

#[test]
fn behind_a_paced_port_qta_mux_serves_urgent_first_and_fifo_does_not() {
    let qta = SchedulerConfig::QtaMux(QtaMuxConfig::new(vec![100, 50]));
    let d = paced_port_delays(&qta);
    let (urgent, be) = (d[&1], d[&2]);
    // Urgent waits at most for the frame on the wire and the burst ahead.
    assert!(urgent.0 < 3.0, "urgent mean {} ms", urgent.0);
    assert_eq!(urgent.2, 0, "urgent PDUs dropped");
    // Best effort queues up to its threshold and loses the excess (1/6).
    assert!(be.0 > 20.0, "best-effort mean {} ms", be.0);
    assert!(be.2 > 300, "best-effort drops {}", be.2);

    let fifo = SchedulerConfig::Fifo(FifoConfig { queue_len: 50 });
    let d = paced_port_delays(&fifo);
    let (urgent, be) = (d[&1], d[&2]);
    assert!(urgent.0 > 20.0, "FIFO urgent mean {} ms", urgent.0);
    assert!((urgent.0 / be.0 - 1.0).abs() < 0.2, "{urgent:?} vs {be:?}");
}

#[test]
fn scaled_policies_scale_their_rates_and_nothing_else() {
    let text = r#"
        policy = "rate-limit-2d"
        queue_len = 1000
        urgency = [{ rate_bps = 15000000, max_backlog_bytes = 12500 }, { rate_bps = 45000000, max_backlog_bytes = 12500 }]
        cherish = [{ rate_bps = 15000000, max_backlog_bytes = 12500 }, { rate_bps = 0, max_backlog_bytes = 100 }]
        "#;
    let c: SchedulerConfig = toml::from_str(text).unwrap();
    let SchedulerConfig::RateLimit2d(s) = c.scaled(0.1) else {
        panic!("policy changed")
    };
    let rates: Vec<u64> = s
        .urgency
        .iter()
        .chain(&s.cherish)
        .map(|l| l.rate_bps)
        .collect();
    assert_eq!(rates, [1_500_000, 4_500_000, 1_500_000, 0]);
    assert!(s.urgency.iter().all(|l| l.max_backlog_bytes == 12500));
    let ds: SchedulerConfig = toml::from_str(
        r#"
        policy = "diffserv"
        classes = [{ limit = { rate_bps = 15000000, burst_bytes = 12500 } }, {}]
        "#,
    )
    .unwrap();
    let SchedulerConfig::Diffserv(d) = ds.scaled(0.5) else {
        panic!("policy changed")
    };
    let l = d.classes[0].limit.unwrap();
    assert_eq!((l.rate_bps, l.burst_bytes), (7_500_000, 12500));
    assert!(d.classes[1].limit.is_none());
    let fifo = SchedulerConfig::default();
    assert_eq!(fifo.scaled(0.1), fifo);
}

/// A dimension with more levels than a cube's level (a byte) can name is
/// refused before anything is built: the 2-D limiter made a queue per pair
/// of levels up front, and 30,000 of each in a 2 MB file asked for 28.8 GB
/// (at `--check`, start or reload, which it aborted).
#[test]
fn more_levels_than_a_byte_names_are_refused() {
    let lvl = LevelLimit {
        rate_bps: 1,
        max_backlog_bytes: 1,
    };
    let rlim = |n: usize| {
        SchedulerConfig::RateLimit2d(RateLimitConfig {
            urgency: vec![lvl; n],
            cherish: vec![lvl; n],
            queue_len: 10,
            cherish_thresholds: vec![],
            mgmt_queue_len: 10,
        })
    };
    let cu = CuMap::new().with(1, 0, 0);
    assert!(rlim(MAX_LEVELS).build(&cu).is_ok());
    let e = rlim(30_000).build(&cu).unwrap_err().to_string();
    assert!(e.contains("30000 levels") && e.contains("urgency"), "{e}");
    let qta = SchedulerConfig::QtaMux(QtaMuxConfig::new(vec![1; MAX_LEVELS + 1]));
    let e = qta.build(&cu).unwrap_err().to_string();
    assert!(e.contains("cherish_thresholds"), "{e}");
    let ds = SchedulerConfig::Diffserv(DiffServConfig {
        classes: vec![DsClass { limit: None }; MAX_LEVELS + 1],
        queue_len: 10,
        mgmt_queue_len: 3,
    });
    assert!(ds.build(&cu).unwrap_err().to_string().contains("classes"));
}
