//! Seed 004's home-to-ISP link on the simulator: 100 Mb/s, the seven cubes
//! of Table 2 in a 3 x 3 C/U matrix, the 2-D urgency/cherish rate limiter
//! with Table 3's limits ("R-lim"), and the per-cube QTA-Mux and per-cherish
//! DiffServ limits of Table 4. Sources send PDUs of 200 to 1500 bytes.

use rina_core::rmt::{
    BucketParams, CuMap, DiffServConfig, DsClass, LevelLimit, QosId, QtaMuxConfig, RateLimitConfig,
    SchedulerConfig,
};
use rina_core::Instant;
use rina_sim::qos_port::{Pattern, QosExperiment, Report, Source, Stage};
use std::time::Duration;

const LINK: u64 = 100_000_000;
const MB: u64 = 1_000_000;
const MAX_PDU: u64 = 1500;
const BACKLOG: u64 = 12_500;

// Table 2: the letter is the urgency, the digit the cherish level.
const A1: QosId = 11;
const A2: QosId = 12;
const B1: QosId = 21;
const B2: QosId = 22;
const B3: QosId = 23;
const C2: QosId = 32;
const C3: QosId = 33;
const CUBES: [QosId; 7] = [A1, A2, B1, B2, B3, C2, C3];
const NAMES: [&str; 7] = ["A1", "A2", "B1", "B2", "B3", "C2", "C3"];

fn cu() -> CuMap {
    let mut m = CuMap::new();
    for q in CUBES {
        m = m.with(q, (q / 10 - 1) as u8, (q % 10 - 1) as u8);
    }
    m
}

/// Table 3: 15 Mb/s for the top level, +45 for the next, +40 for the rest.
fn rlim() -> SchedulerConfig {
    let l = |r: u64| LevelLimit {
        rate_bps: r * MB,
        max_backlog_bytes: BACKLOG,
    };
    SchedulerConfig::RateLimit2d(RateLimitConfig {
        urgency: vec![l(15), l(45), l(40)],
        cherish: vec![l(15), l(45), l(40)],
        queue_len: 1000,
        cherish_thresholds: vec![1000, 500, 100],
        mgmt_queue_len: 100,
    })
}

/// Table 4, QTA: a policer per cube.
fn qta_per_cube() -> SchedulerConfig {
    let mut c = QtaMuxConfig::new(vec![1000, 500, 100]);
    for (q, r) in [
        (A1, 5),
        (A2, 10),
        (B1, 10),
        (B2, 15),
        (B3, 20),
        (C2, 20),
        (C3, 20),
    ] {
        c.cube_mut(q).limit = Some(BucketParams {
            rate_bps: r * MB,
            burst_bytes: BACKLOG,
        });
    }
    SchedulerConfig::QtaMux(c)
}

/// Table 4, DS: 15 Mb/s for cherish 1, 45 for cherish 2, no limit for 3.
fn diffserv() -> SchedulerConfig {
    let lim = |r: u64| DsClass {
        limit: Some(BucketParams {
            rate_bps: r * MB,
            burst_bytes: BACKLOG,
        }),
    };
    SchedulerConfig::Diffserv(DiffServConfig {
        classes: vec![lim(15), lim(45), DsClass { limit: None }],
        queue_len: 1000,
        mgmt_queue_len: 100,
    })
}

/// Runs `policy` for `secs` with cube `q` offering `offered[i]` Mb/s (CBR
/// intervals, sizes varying, as seed 004's validation sources).
fn run(policy: &SchedulerConfig, offered: [f64; 7], secs: u64) -> Report {
    let mut e = QosExperiment::new(4, &NAMES);
    for (i, &mbps) in offered.iter().enumerate() {
        if mbps == 0.0 {
            continue;
        }
        // Several sources per cube so the arrivals interleave.
        for _ in 0..4 {
            e = e.source(Source {
                class: i,
                qos_id: CUBES[i],
                pattern: Pattern::Cbr {
                    rate_bps: (mbps * 1e6 / 4.0) as u64,
                },
                pdu_bytes: (200, MAX_PDU as usize),
            });
        }
    }
    e.stage(Stage::new(policy.build(&cu()).unwrap(), LINK))
        .run(Duration::from_secs(secs))
        .unwrap()
}

fn mbps(r: &Report, qs: &[QosId], secs: u64) -> f64 {
    // Skip the first second (queues filling).
    r.rate_bps(
        qs,
        Instant::from_nanos(1_000_000_000),
        Instant::from_nanos(secs * 1_000_000_000),
    ) / 1e6
}

fn show(label: &str, r: &Report, secs: u64) {
    let per: Vec<String> = CUBES
        .iter()
        .zip(NAMES)
        .map(|(&q, n)| format!("{n} {:.2}", mbps(r, &[q], secs)))
        .collect();
    println!("{label}: {} (Mb/s)", per.join(", "));
}

const URG_A: &[QosId] = &[A1, A2];
const URG_AB: &[QosId] = &[A1, A2, B1, B2, B3];
const CH_1: &[QosId] = &[A1, B1];
const CH_12: &[QosId] = &[A1, A2, B1, B2, C2];

#[test]
fn rate_limiter_caps_urgent_and_cherished_traffic_in_every_window() {
    let secs = 20;
    // Every cube offers 30 Mb/s: 210 Mb/s on a 100 Mb/s link.
    let r = run(&rlim(), [30.0; 7], secs);
    show("r-lim, all greedy", &r, secs);
    let w = Duration::from_millis(100);
    // Bound in a window: the levels' rate, their backlog and one PDU of
    // debt (a PDU may leave the level negative).
    let bound =
        |rate_mbps: u64, levels: u64| rate_mbps * MB / 10 + levels * BACKLOG * 8 + MAX_PDU * 8;
    for (what, qs, rate, levels) in [
        ("urgency A", URG_A, 15, 1),
        ("urgency A+B", URG_AB, 60, 2),
        ("cherish 1", CH_1, 15, 1),
        ("cherish 1+2", CH_12, 60, 2),
    ] {
        let most = r.max_bits_in_window(qs, w);
        let avg = mbps(&r, qs, secs);
        println!(
            "{what}: average {avg:.2} Mb/s, busiest 100 ms {:.2} Mb/s",
            most as f64 / 1e5
        );
        assert!(most <= bound(rate, levels), "{what}: {most} bits in 100 ms");
        assert!(avg <= rate as f64, "{what}: {avg} Mb/s");
    }
    // What the top levels may not use, the lower ones do: the link is full.
    let total = mbps(&r, &CUBES, secs);
    println!("total {total:.2} Mb/s");
    assert!(total > 98.0, "{total}");
}

#[test]
fn rate_limiter_passes_traffic_within_its_limits_urgent_first() {
    let secs = 10;
    // Table 4's per-cube figures at 90 %: urgency A 13.5, B 40.5, C 36
    // Mb/s; cherish 1 13.5, 2 40.5, 3 36 — within every R-lim limit.
    let offered = [4.5, 9.0, 9.0, 13.5, 18.0, 18.0, 18.0];
    let r = run(&rlim(), offered, secs);
    show("r-lim, within limits", &r, secs);
    for ((&q, n), want) in CUBES.iter().zip(NAMES).zip(offered) {
        let got = mbps(&r, &[q], secs);
        assert!(
            (want * 0.97..=want * 1.03).contains(&got),
            "{n}: {got} of {want} Mb/s"
        );
        assert!(r.class(n).loss() < 0.001, "{n}: {}", r.class(n).loss());
    }
    let mean = |names: &[&str]| {
        names
            .iter()
            .map(|n| r.class(n).mean.as_secs_f64())
            .fold(0.0, f64::max)
            * 1e3
    };
    let (a, b, c) = (
        mean(&["A1", "A2"]),
        mean(&["B1", "B2", "B3"]),
        mean(&["C2", "C3"]),
    );
    println!("r-lim within limits, worst mean delay: A {a:.3} ms, B {b:.3} ms, C {c:.3} ms");
    assert!(a <= b && b < c, "urgency order: A {a}, B {b}, C {c}");
}

#[test]
fn rate_limiter_lets_lower_levels_use_what_higher_ones_leave() {
    let secs = 10;
    let alone = |i: usize| {
        let mut o = [0.0; 7];
        o[i] = 120.0;
        let r = run(&rlim(), o, secs);
        mbps(&r, &[CUBES[i]], secs)
    };
    // A1 alone is held to the top urgency and cherish level: 15 Mb/s.
    let a1 = alone(0);
    // B2 may borrow from urgency A and cherish 1: 15 + 45.
    let b2 = alone(3);
    // C3 may use everything: the link.
    let c3 = alone(6);
    println!("alone: A1 {a1:.2}, B2 {b2:.2}, C3 {c3:.2} Mb/s");
    assert!((14.5..=15.3).contains(&a1), "A1 {a1}");
    assert!((58.0..=60.5).contains(&b2), "B2 {b2}");
    assert!(c3 > 98.0, "C3 {c3}");

    // A1 uses 10 of its 15 Mb/s and loses nothing; C3 takes the rest.
    let r = run(&rlim(), [10.0, 0.0, 0.0, 0.0, 0.0, 0.0, 120.0], secs);
    show("r-lim, A1 10 + C3 greedy", &r, secs);
    let a1 = r.class("A1");
    assert_eq!(a1.lost(), 0);
    let c3 = mbps(&r, &[C3], secs);
    assert!(c3 > 88.0, "C3 {c3}");
    // Urgent traffic under its limit waits less than the bulk.
    assert!(
        a1.mean * 10 < r.class("C3").mean,
        "{:?} vs {:?}",
        a1.mean,
        r.class("C3").mean
    );
}

#[test]
fn qta_mux_per_cube_limits_hold_each_cube_to_its_share() {
    let secs = 10;
    let r = run(&qta_per_cube(), [30.0; 7], secs);
    show("qta per cube, all greedy", &r, secs);
    for ((&q, n), limit) in CUBES
        .iter()
        .zip(NAMES)
        .zip([5.0, 10.0, 10.0, 15.0, 20.0, 20.0, 20.0])
    {
        let got = mbps(&r, &[q], secs);
        assert!(
            (limit * 0.97..=limit * 1.02).contains(&got),
            "{n}: {got} for a limit of {limit}"
        );
    }
    // A cube alone cannot use the idle link (seed 004's argument against
    // per-class limits): C3 stays at 20 Mb/s.
    let r = run(&qta_per_cube(), [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 120.0], secs);
    let c3 = mbps(&r, &[C3], secs);
    println!("qta per cube, C3 alone: {c3:.2} Mb/s");
    assert!((19.4..=20.4).contains(&c3), "{c3}");
    // Urgency still orders the mux: the urgent cubes wait less.
    let r = run(
        &qta_per_cube(),
        [5.0, 10.0, 10.0, 15.0, 20.0, 20.0, 20.0],
        secs,
    );
    assert!(r.class("A2").mean < r.class("C2").mean);
}

#[test]
fn diffserv_limits_cherish_classes_and_does_not_differentiate_delay() {
    let secs = 10;
    // Cherish 1 offers 60 Mb/s, cherish 2 90, cherish 3 20: after the
    // policers, 80 Mb/s reach the link.
    let r = run(
        &diffserv(),
        [30.0, 30.0, 30.0, 30.0, 10.0, 30.0, 10.0],
        secs,
    );
    show("diffserv, 150 Mb/s offered", &r, secs);
    let c1 = mbps(&r, CH_1, secs);
    let c2 = mbps(&r, &[A2, B2, C2], secs);
    let c3 = mbps(&r, &[B3, C3], secs);
    println!("diffserv: cherish 1 {c1:.2}, cherish 2 {c2:.2}, cherish 3 {c3:.2} Mb/s");
    assert!((14.5..=15.3).contains(&c1), "{c1}");
    assert!((43.5..=45.5).contains(&c2), "{c2}");
    // Over-limit PDUs are dropped, not delayed; cherish 3 has no limit.
    assert!(r.class("A1").loss() > 0.4, "{}", r.class("A1").loss());
    assert_eq!((r.class("B3").lost(), r.class("C3").lost()), (0, 0));

    // Overloaded: the limits still hold and, one FIFO for all, the most
    // and the least urgent cubes wait alike.
    let r = run(&diffserv(), [30.0; 7], secs);
    show("diffserv, all greedy", &r, secs);
    let w = Duration::from_millis(100);
    let most = r.max_bits_in_window(CH_1, w);
    assert!(most <= 15 * MB / 10 + BACKLOG * 8, "{most} bits in 100 ms");
    let (a1, c3) = (
        r.class("A1").mean.as_secs_f64(),
        r.class("C3").mean.as_secs_f64(),
    );
    println!(
        "diffserv mean delay: A1 {:.3} ms, C3 {:.3} ms",
        a1 * 1e3,
        c3 * 1e3
    );
    assert!(c3 > 0.05, "the FIFO must be congested: {c3} s");
    assert!(a1 > c3 * 0.8 && a1 < c3 * 1.25, "A1 {a1} s, C3 {c3} s");
}
