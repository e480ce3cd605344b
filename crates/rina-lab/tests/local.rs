//! The `local` backend on the README's experiment (line-3, shortened):
//! echo replies from the application at c with RTTs that reflect the two
//! 1 ms links, the tgen flow delivered, perf goodput points.
//!
//! Needs `rinad` and the tools next to the test binary's folder; the test
//! builds them (`cargo build -p rinad -p rina-tools`) if they are missing.

#[path = "real_common/mod.rs"]
mod common;

use rina_lab::backend::{local::Local, Backend};
use std::time::Duration;

#[test]
fn line_3_runs_on_local_with_emulated_link_delays() {
    common::ensure_binaries();
    let text = std::fs::read_to_string(common::example("line-3.toml")).unwrap();
    let exp = rina_lab::load(&text, None)
        .unwrap()
        .shortened(Duration::from_secs(3));
    let dir = common::run_dir("local-line-3");
    let mut be = Local::default();
    be.check().expect("binaries found");
    let out = common::run(&mut be, &exp, &dir);
    common::check_line_3(&out, &dir);
}

#[test]
fn link_emulation_adds_delay_and_loss_to_echo() {
    common::ensure_binaries();
    // The same line twice: links without delay (the stack's own RTT on
    // this machine), then two 5 ms links with 20% loss on the second. The
    // emulation must add 4 x 5 ms to the RTT and lose about 36% of the
    // probes (1 - 0.8^2: a probe and its reply both cross the lossy link).
    let mut rtt = Vec::new();
    let mut last = None;
    for (delay, loss) in [(0, 0.0), (5, 0.2)] {
        let exp = rina_lab::load(&common::echo_experiment(delay, loss), None).unwrap();
        let dir = common::run_dir(&format!("local-delay-{delay}"));
        let out = common::run(&mut Local::default(), &exp, &dir);
        let e = out.flows[0].clone();
        assert_eq!(e.error, None, "{e:?}");
        println!(
            "links {delay} ms, loss {loss}: sent {} received {} loss {:.1}% RTT min {:.2} avg {:.2} ms; link drops {:?}",
            e.sent,
            e.received,
            e.loss_pct,
            2.0 * e.delay_min_ms.unwrap(),
            e.rtt_avg_ms.unwrap(),
            out.links.iter().map(|l| l.dropped).collect::<Vec<_>>()
        );
        rtt.push(2.0 * e.delay_min_ms.unwrap());
        last = Some((e, out));
    }
    let (e, out) = last.unwrap();
    let added = rtt[1] - rtt[0];
    assert!(rtt[1] >= 20.0, "RTT {} ms below 4 x 5 ms", rtt[1]);
    assert!(
        (15.0..45.0).contains(&added),
        "the links added {added} ms to the minimum RTT, not about 20 ms"
    );
    assert!(
        (15.0..60.0).contains(&e.loss_pct),
        "loss {} % not near 36 %",
        e.loss_pct
    );
    assert!(out.links[1].dropped > 0 && out.links[0].dropped == 0);
}

#[test]
fn application_move_is_followed_by_a_new_allocation() {
    common::ensure_binaries();
    // The server moves from d (3 hops from a) to f (3 hops, other branch)
    // half-way; the client's flow is allocated again to the same name.
    let text = std::fs::read_to_string(common::example("location.toml")).unwrap();
    let exp = rina_lab::load(&text, None)
        .unwrap()
        .shortened(Duration::from_secs(4));
    let dir = common::run_dir("local-location");
    let out = common::run(&mut Local::default(), &exp, &dir);
    for f in &out.flows {
        println!(
            "{} served by {:?}: {}/{} {:?}",
            f.flow, f.served_by, f.received, f.sent, f.error
        );
    }
    assert_eq!(out.flows.len(), 2, "{:?}", out.flows);
    let (before, after) = (&out.flows[0], &out.flows[1]);
    assert_eq!(before.served_by.as_deref(), Some("d"));
    assert_eq!(after.served_by.as_deref(), Some("f"));
    assert!(after.flow.ends_with("#2"));
    assert!(before.received > 0 && after.received > 0, "{:?}", out.flows);
    assert!(out
        .timeline
        .iter()
        .any(|t| t.what.contains("moved from d to f")));
}

/// Processes whose command line mentions `needle`.
fn processes_mentioning(needle: &str) -> usize {
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return 0;
    };
    rd.filter_map(|e| e.ok())
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .filter(|c| String::from_utf8_lossy(c).contains(needle))
        .count()
}

#[test]
fn ctrl_c_stops_everything_started() {
    use rina_lab::backend::RunCtx;
    use std::sync::atomic::{AtomicBool, Ordering};
    common::ensure_binaries();
    let text = std::fs::read_to_string(common::example("line-3.toml")).unwrap();
    let exp = rina_lab::load(&text, None).unwrap();
    let dir = common::run_dir("local-ctrl-c");
    let stop = AtomicBool::new(false);
    let (traffic_tx, traffic) = std::sync::mpsc::channel::<()>();
    let progress = |_: f64, what: &str| {
        if what.starts_with("traffic") {
            let _ = traffic_tx.send(());
        }
    };
    let ctx = RunCtx {
        dir: &dir,
        progress: &progress,
        stop: &stop,
    };
    let needle = dir.display().to_string();
    let r = std::thread::scope(|s| {
        let h = s.spawn(|| Local::default().run_once(&exp, &ctx));
        // Ctrl-C once traffic runs (and rinad, servers and clients with it);
        // a run that ends before says why.
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while traffic.recv_timeout(Duration::from_millis(100)).is_err() {
            if h.is_finished() {
                let r = h.join().unwrap();
                panic!("the run ended before its traffic: {r:?}");
            }
            assert!(
                std::time::Instant::now() < deadline,
                "traffic did not start within 60 s"
            );
        }
        assert!(processes_mentioning(&needle) >= 3, "rinad not running");
        stop.store(true, Ordering::Relaxed);
        h.join().unwrap()
    });
    assert!(matches!(r, Err(rina_lab::LabError::Interrupted)), "{r:?}");
    assert_eq!(processes_mentioning(&needle), 0, "processes left running");
}

#[test]
fn real_daemons_schedule_urgent_first_at_a_congested_link_one_dif_and_a_stack() {
    common::ensure_binaries();
    for file in ["qos-2.toml", "qos-2-stack.toml"] {
        let mut outs = Vec::new();
        for v in ["qta", "fifo"] {
            let exp = common::qos_2(file, v);
            let dir = common::run_dir(&format!("local-{file}-{v}"));
            outs.push(common::run(&mut Local::default(), &exp, &dir));
        }
        common::check_qos_2(&format!("local {file}"), &outs[0], &outs[1]);
    }
}

#[test]
fn three_reliable_flows_share_a_10_mbps_bottleneck_fairly() {
    common::ensure_binaries();
    // Issue 21: three reliable rina-perf flows (8 s each) through r over
    // one 10 Mb/s, 5 ms link with a 100-frame queue. Every flow completes
    // (its REPORT comes although the flow's send buffer holds seconds of
    // data at its share), every SDU arrives once and in order, the link is
    // used and shared. Each flow's goodput counts from its first SDU to
    // its last; over 12 runs on an idle machine the three together took
    // 75-96 % of the link (1200-byte SDUs over the nominal rate), 86-93 %
    // in most, with Jain's index above 0.98. The bounds leave room for a
    // loaded 2-core machine, where the relay's timers and the five
    // daemons are late at times, yet fail on what issue 21 was about: a
    // flow that never completes, a link left idle after losses (38 % in
    // the loss figures) or one flow taking most of it (the
    // issue's 58 / 24 / 13 split had Jain 0.74).
    let text = std::fs::read_to_string(common::example("cc-share.toml")).unwrap();
    let exp = rina_lab::load(&text, None).unwrap();
    let dir = common::run_dir("local-cc-share");
    let out = common::run(&mut Local::default(), &exp, &dir);
    let rates = common::reliable_perf_flows(&out, &dir);
    assert_eq!(rates.len(), 3);
    let total: f64 = rates.iter().sum();
    let jain = common::jain(&rates);
    println!(
        "3 flows: {:.2} Mb/s, utilisation {:.1} %, Jain {jain:.3}",
        total / 1e6,
        total / 1e7 * 100.0
    );
    assert!(total >= 0.7 * 10e6, "utilisation {:.1} %", total / 1e5);
    assert!(total <= 10.5e6, "more than the link: {total} b/s");
    assert!(jain >= 0.9, "Jain {jain:.3}: {rates:?}");
}

#[test]
fn seed_004_home_isp_on_real_daemons_holds_table_3_and_voice_stays_fast() {
    // R-lim on the home's port of home2isp, the rlim matrix (150 voice, 7
    // videos, 12 P2P), 20 s, at 1/10 of the paper's rates: link, sources
    // and the limiter's levels scaled together (169 tgen processes and
    // their daemons at 52 Mb/s do not fit beside other work on 2 cores).
    common::ensure_binaries();
    const F: f64 = 0.1;
    let text = std::fs::read_to_string(common::example("home-isp.toml")).unwrap();
    let exp = rina_lab::load(&text, Some("rlim"))
        .unwrap()
        .shortened(Duration::from_secs(20))
        .scaled(F);
    let dir = common::run_dir("local-home-isp-rlim");
    let out = common::run(&mut Local::default(), &exp, &dir);
    print!("{}", out.summary_table());
    common::check_table_3_scaled("local rlim", &out, F);
    let voice = common::class(&out, "voice A2");
    let video = common::class(&out, "video-hd B1");
    assert!(voice.received > 0 && voice.loss_pct < 1.0, "{voice:?}");
    // The urgent cube (A2) is served first and its level is far from its
    // limit: its mean delay stays below 50 ms and below the video's.
    let v = voice.avg_ms.unwrap();
    assert!(
        v < 50.0 && v < video.avg_ms.unwrap(),
        "voice {v} ms, video {:?}",
        video.avg_ms
    );
}
