//! Seed 003 (ERASER) on a simulated congested port: the five traffic
//! classes of Table I at 90 % load, FIFO against QTA-Mux, and the two-DIF
//! stack of §III where differentiating only in the upper DIF is lost when
//! the lower DIF is congested.
//!
//! Cube placement: the MR DIF's 2 x 2 matrix (A1, A2, B1, B2) and mapping
//! are the paper's; the SPN DIF's 3 x 2 matrix is not spelled out in the
//! text, so it is taken from the 3 x 2 matrix §IV proposes (Gold A1, Silver
//! B1, Sensitive BE B2, Bronze C1, BE C2). Thresholds are the paper's, per
//! cube (1250 / 50 / 1100 PDUs), against the PDU's urgency queue as in
//! IRATI's QTA-Mux used for the experiment; skip probability 5 %.

use rina_core::rmt::{CuMap, FifoConfig, Occupancy, QtaMuxConfig, SchedulerConfig};
use rina_sim::qos_port::{Pattern, QosExperiment, Report, Source, Stage};
use std::time::Duration;

const CLASSES: [&str; 5] = ["video", "gaming", "voip", "files", "interactive"];
// SPN cubes.
const GOLD: u64 = 1;
const SILVER: u64 = 2;
const SBE: u64 = 3;
const BRONZE: u64 = 4;
const BE: u64 = 5;
// MR cubes.
const A1: u64 = 11;
const A2: u64 = 12;
const B1: u64 = 21;
const B2: u64 = 22;

const SECS: u64 = 120;

fn s(n: f64) -> Duration {
    Duration::from_secs_f64(n)
}

/// Table I, `sets` flows of each application.
fn table1(sets: usize) -> Vec<Source> {
    let mut v = Vec::new();
    for _ in 0..sets {
        v.push(Source::new(
            0,
            GOLD,
            Pattern::Cbr {
                rate_bps: 1_500_000,
            },
            1000,
        ));
        v.push(Source::new(
            1,
            SILVER,
            Pattern::OnOff {
                rate_bps: 4_000_000,
                mean_on: s(4.0),
                mean_off: s(2.0),
            },
            1000,
        ));
        v.push(Source::new(
            2,
            SBE,
            Pattern::OnOff {
                rate_bps: 64_000,
                mean_on: s(3.0),
                mean_off: s(3.0),
            },
            200,
        ));
        v.push(Source::new(
            3,
            BRONZE,
            Pattern::OnOff {
                rate_bps: 5_000_000,
                mean_on: s(2.0),
                mean_off: s(1.0),
            },
            1000,
        ));
        v.push(Source::new(
            4,
            BE,
            Pattern::Poisson {
                rate_bps: 2_000_000,
            },
            1000,
        ));
    }
    v
}

fn spn_map() -> CuMap {
    CuMap::new()
        .with(GOLD, 0, 0)
        .with(SILVER, 1, 0)
        .with(SBE, 1, 1)
        .with(BRONZE, 2, 0)
        .with(BE, 2, 1)
}

fn mr_map() -> CuMap {
    CuMap::new()
        .with(A1, 0, 0)
        .with(A2, 0, 1)
        .with(B1, 1, 0)
        .with(B2, 1, 1)
}

/// Seed 003's QTA-Mux: per-cube thresholds, 5 % skip.
fn qta(thresholds: &[(u64, usize)], seed: u64) -> SchedulerConfig {
    let mut c = QtaMuxConfig::new(vec![1250, 1100]);
    c.occupancy = Occupancy::Urgency;
    c.skip_probability = 0.05;
    c.seed = seed;
    for &(q, t) in thresholds {
        c.cube_mut(q).threshold = Some(t);
    }
    SchedulerConfig::QtaMux(c)
}

fn spn_qta() -> SchedulerConfig {
    qta(
        &[
            (GOLD, 1250),
            (SILVER, 1250),
            (BRONZE, 1250),
            (SBE, 50),
            (BE, 1100),
        ],
        3,
    )
}

fn fifo(n: usize) -> SchedulerConfig {
    SchedulerConfig::Fifo(FifoConfig { queue_len: n })
}

/// Experiment over `sets` flow sets with the capacity that makes the
/// average offered load 90 %.
fn experiment(sets: usize) -> (QosExperiment, u64) {
    let mut e = QosExperiment::new(2018, &CLASSES);
    for src in table1(sets) {
        e = e.source(src);
    }
    let cap = (e.offered_bps() / 0.9) as u64;
    (e, cap)
}

fn show(label: &str, r: &Report) {
    for c in &r.classes {
        println!(
            "{label:>10} {:>12}: offered {:>7} loss {:>7.3} % mean {:>9.3} ms p99 {:>9.3} ms max {:>9.3} ms",
            c.name,
            c.offered,
            100.0 * c.loss(),
            c.mean.as_secs_f64() * 1e3,
            c.p99.as_secs_f64() * 1e3,
            c.max.as_secs_f64() * 1e3
        );
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Urgent (video, gaming, VoIP) far ahead of non-urgent (files,
/// interactive) in mean and 99th-percentile delay; cherished files lose
/// fewer PDUs than interactive.
fn assert_differentiated(r: &Report) {
    let worst_urgent_mean = (0..3).map(|i| ms(r.classes[i].mean)).fold(0.0, f64::max);
    let best_lazy_mean = (3..5)
        .map(|i| ms(r.classes[i].mean))
        .fold(f64::MAX, f64::min);
    let worst_urgent_p99 = (0..3).map(|i| ms(r.classes[i].p99)).fold(0.0, f64::max);
    let best_lazy_p99 = (3..5)
        .map(|i| ms(r.classes[i].p99))
        .fold(f64::MAX, f64::min);
    assert!(
        worst_urgent_mean * 10.0 < best_lazy_mean,
        "mean: urgent {worst_urgent_mean} ms, non-urgent {best_lazy_mean} ms"
    );
    assert!(
        worst_urgent_p99 * 10.0 < best_lazy_p99,
        "p99: urgent {worst_urgent_p99} ms, non-urgent {best_lazy_p99} ms"
    );
    let (files, inter) = (r.class("files"), r.class("interactive"));
    assert!(
        inter.lost() > 0,
        "the port must be congested enough to drop"
    );
    assert!(
        files.loss() * 2.0 < inter.loss(),
        "files (cherished) {} vs interactive {}",
        files.loss(),
        inter.loss()
    );
    for i in 0..3 {
        assert!(r.classes[i].loss() <= files.loss(), "{}", r.classes[i].name);
    }
}

/// Every class within a factor of 2 of the others in mean delay, and no
/// class far behind in the 99th percentile.
fn assert_undifferentiated(r: &Report) {
    let means: Vec<f64> = r.classes.iter().map(|c| ms(c.mean)).collect();
    let p99s: Vec<f64> = r.classes.iter().map(|c| ms(c.p99)).collect();
    let ratio = |v: &[f64]| {
        v.iter().fold(0.0, |a: f64, &b| a.max(b)) / v.iter().fold(f64::MAX, |a, &b| a.min(b))
    };
    assert!(means[0] > 5.0, "the port must be congested: {means:?}");
    assert!(ratio(&means) < 2.0, "means {means:?}");
    assert!(ratio(&p99s) < 2.0, "p99 {p99s:?}");
}

#[test]
fn congested_port_fifo_treats_all_classes_alike() {
    let (e, cap) = experiment(3);
    let r = e
        .stage(Stage::new(fifo(2500).build(&spn_map()).unwrap(), cap))
        .run(Duration::from_secs(SECS))
        .unwrap();
    show("fifo", &r);
    assert_undifferentiated(&r);
}

#[test]
fn congested_port_qta_mux_differentiates_urgency_and_cherish() {
    let (e, cap) = experiment(3);
    let r = e
        .stage(Stage::new(spn_qta().build(&spn_map()).unwrap(), cap))
        .run(Duration::from_secs(SECS))
        .unwrap();
    show("qta-mux", &r);
    assert_differentiated(&r);
    // The counters of the port agree with what left it.
    let stats = &r.stats[0];
    let sent: u64 = stats
        .iter()
        .filter(|q| q.queue.starts_with("qos-"))
        .map(|q| q.sent)
        .sum();
    assert_eq!(sent, r.classes.iter().map(|c| c.delivered).sum::<u64>());
}

/// The two-DIF stack: the SPN DIF's port (QTA-Mux, fast: the MR DIF
/// accepts all it is offered) over the MR DIF's congested port.
fn stack(lower: SchedulerConfig, lower_map: &CuMap) -> Report {
    let (e, cap) = experiment(3);
    let upper = Stage::new(spn_qta().build(&spn_map()).unwrap(), cap * 10);
    let lower = Stage::new(lower.build(lower_map).unwrap(), cap)
        .map(GOLD, A1)
        .map(SILVER, A1)
        .map(SBE, A2)
        .map(BRONZE, B1)
        .map(BE, B2);
    e.stage(upper)
        .stage(lower)
        .run(Duration::from_secs(SECS))
        .unwrap()
}

#[test]
fn two_dif_stack_differentiating_only_upstairs_is_lost_below() {
    // "SPN DIF only": the MR DIF is a FIFO of 2500 PDUs.
    let r = stack(fifo(2500), &mr_map());
    show("spn only", &r);
    assert_undifferentiated(&r);
}

#[test]
fn two_dif_stack_differentiating_in_both_restores_it() {
    let mr = qta(&[(A1, 1250), (B1, 1250), (A2, 50), (B2, 1100)], 4);
    let r = stack(mr, &mr_map());
    show("spn+mr", &r);
    assert_differentiated(&r);
}
