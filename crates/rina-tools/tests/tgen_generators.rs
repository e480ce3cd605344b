//! `rina-tgen`'s generators over long seeded runs, in virtual time: mean
//! rates within stated tolerances of their targets, Poisson gaps exponential
//! (Kolmogorov–Smirnov at α = 0.01), ON-OFF periods with the configured means.

use rina_tools::tgen::gen::{Generator, Profile};

/// Offered rate (bit/s) of the SDUs sent in [0, `secs`).
fn rate_over(p: &Profile, seed: u64, secs: f64) -> f64 {
    let end = (secs * 1e9) as u64;
    let bytes: u64 = Generator::new(p.clone(), seed)
        .take_while(|x| x.at_ns < end)
        .map(|x| x.size as u64)
        .sum();
    bytes as f64 * 8.0 / secs
}

fn named(n: &str) -> Profile {
    Profile::named(n).unwrap()
}

fn assert_close(what: &str, got: f64, want: f64, tol: f64) {
    let rel = (got - want).abs() / want;
    println!(
        "{what}: {got:.1} vs {want:.1} ({:.3}% off, tolerance {:.1}%)",
        rel * 100.0,
        tol * 100.0
    );
    assert!(
        rel <= tol,
        "{what}: {got} is {:.3}% away from {want}",
        rel * 100.0
    );
}

#[test]
fn cbr_rate_is_exact() {
    // 1.5 Mb/s of 1400-byte SDUs over 100 s: within 0.1 % (one SDU).
    let p = named("hd-video-call");
    assert_close("hd-video-call", rate_over(&p, 1, 100.0), 1.5e6, 0.001);
    // Gaps are all equal.
    let v: Vec<_> = Generator::new(p, 1).take(1000).collect();
    let gap = v[1].at_ns - v[0].at_ns;
    assert!(v
        .windows(2)
        .all(|w| (w[1].at_ns - w[0].at_ns).abs_diff(gap) <= 1));
}

#[test]
fn poisson_rate_is_within_one_percent() {
    // 2 Mb/s, ~178 SDU/s over 2000 s: ~357,000 SDUs, 1σ of the count is 0.17 %.
    assert_close(
        "interactive",
        rate_over(&named("interactive"), 2, 2000.0),
        2e6,
        0.01,
    );
}

/// Kolmogorov–Smirnov statistic of `gaps` against Exp(mean).
fn ks_exponential(gaps: &mut [f64], mean: f64) -> f64 {
    gaps.sort_by(f64::total_cmp);
    let n = gaps.len() as f64;
    let mut d: f64 = 0.0;
    for (i, &x) in gaps.iter().enumerate() {
        let f = 1.0 - (-x / mean).exp();
        d = d.max((i as f64 + 1.0) / n - f).max(f - i as f64 / n);
    }
    d
}

fn gaps(p: &Profile, seed: u64, n: usize) -> Vec<f64> {
    let v: Vec<_> = Generator::new(p.clone(), seed).take(n + 1).collect();
    v.windows(2)
        .map(|w| (w[1].at_ns - w[0].at_ns) as f64 / 1e9)
        .collect()
}

#[test]
fn poisson_gaps_pass_kolmogorov_smirnov_at_1_percent() {
    let n = 20_000;
    // Critical value of D at α = 0.01 (asymptotic): 1.628 / √n.
    let crit = 1.628 / (n as f64).sqrt();
    let p = named("interactive");
    let mean = 1400.0 * 8.0 / 2e6;
    for seed in [1, 2, 3] {
        let d = ks_exponential(&mut gaps(&p, seed, n), mean);
        println!("seed {seed}: KS D = {d:.5}, critical {crit:.5}");
        assert!(d < crit, "seed {seed}: D = {d} >= {crit}");
    }
    // The test has power: CBR gaps of the same mean are rejected.
    let cbr = Profile::Cbr {
        rate_bps: 2e6,
        size: 1400,
    };
    let d = ks_exponential(&mut gaps(&cbr, 1, n), mean);
    assert!(d > crit, "CBR passed as exponential: D = {d}");
}

#[test]
fn on_off_rates_match_on_fraction() {
    // Mean rate = ON rate × on / (on + off). Tolerance 3 %; every run spans
    // more than 10,000 ON-OFF cycles (1σ of the ON fraction about 0.7 %).
    for (n, secs) in [
        ("online-gaming", 60_000.0),
        ("voip", 200_000.0),
        ("file-sharing", 40_000.0),
    ] {
        let p = named(n);
        assert_close(n, rate_over(&p, 3, secs), p.mean_rate_bps(), 0.03);
    }
    let p = named("online-gaming");
    assert!((p.mean_rate_bps() - 4e6 * 4.0 / 6.0).abs() < 1e-6);
}

#[test]
fn on_off_periods_have_the_configured_means() {
    for (n, on, off) in [
        ("online-gaming", 4.0, 2.0),
        ("voip", 3.0, 3.0),
        ("file-sharing", 2.0, 1.0),
    ] {
        let mut g = Generator::new(named(n), 4);
        // Run until 20,000 periods of each kind: 1σ of the mean is 0.7 %.
        while g.period_stats().off_periods < 20_000 {
            g.next();
        }
        let s = g.period_stats();
        assert_close(
            &format!("{n} ON"),
            s.on_total_s / s.on_periods as f64,
            on,
            0.03,
        );
        assert_close(
            &format!("{n} OFF"),
            s.off_total_s / s.off_periods as f64,
            off,
            0.03,
        );
    }
}

#[test]
fn on_off_is_silent_during_off() {
    // File sharing: CBR gaps of 2.24 ms during ON; every longer gap is an OFF
    // period, and their total is the OFF time drawn.
    let mut g = Generator::new(named("file-sharing"), 5);
    let v: Vec<_> = g.by_ref().take(200_000).collect();
    let cbr_gap = 1400.0 * 8.0 / 5e6;
    let off: f64 = v
        .windows(2)
        .map(|w| (w[1].at_ns - w[0].at_ns) as f64 / 1e9)
        .filter(|&d| d > cbr_gap * 1.5)
        .map(|d| d - cbr_gap)
        .sum();
    let drawn = g.period_stats().off_total_s;
    // The last drawn OFF may lie beyond the SDUs taken; each gap is off by
    // less than one CBR gap.
    assert!(off <= drawn + 1e-6);
    assert!(
        drawn - off < 2.0 * g.period_stats().off_periods as f64 * cbr_gap + 30.0,
        "{off} vs {drawn}"
    );
}

#[test]
fn seed_004_sources_have_their_mean_rates() {
    // Voice: 20 ms interval, 200 B talking / 40 B silent, means 1 s / 1.35 s.
    let v = named("voice");
    assert_close("voice", rate_over(&v, 6, 20_000.0), v.mean_rate_bps(), 0.03);
    let sizes: std::collections::BTreeSet<_> = Generator::new(v.clone(), 6)
        .take(10_000)
        .map(|p| p.size)
        .collect();
    assert_eq!(sizes.into_iter().collect::<Vec<_>>(), vec![40, 200]);
    let pkts: Vec<_> = Generator::new(v, 6).take(100).collect();
    assert!(pkts
        .windows(2)
        .all(|w| (w[1].at_ns - w[0].at_ns).abs_diff(20_000_000) <= 1));
    // Video and P2P: MTU-sized SDUs at a rate drawn per segment.
    for (n, secs, want) in [
        ("video-hd", 4000.0, 1.5e6),
        ("video-fullhd", 3000.0, 3e6),
        ("p2p", 10_000.0, 2.5e6),
    ] {
        let p = named(n);
        assert_eq!(p.mean_rate_bps(), want);
        assert_close(n, rate_over(&p, 7, secs), want, 0.03);
        assert!(Generator::new(p, 7).take(1000).all(|x| x.size == 1400));
    }
}

#[test]
fn a_voice_rate_override_stretches_the_sdu_interval() {
    let spec = |rate_bps| rina_tools::tgen::gen::SourceSpec {
        profile: "voice".into(),
        rate_bps,
        ..Default::default()
    };
    let base = spec(None).profile().unwrap();
    let tenth = spec(Some(base.mean_rate_bps() / 10.0)).profile().unwrap();
    match tenth {
        Profile::Voice { interval_s, .. } => assert!((interval_s - 0.2).abs() < 1e-9),
        other => panic!("{other:?}"),
    }
    assert!(spec(Some(0.0)).profile().is_err());
}
