//! Every scenario of `examples/lab/` on the `sim` backend, shortened, and
//! the effect each exists to show.

#[path = "real_common/mod.rs"]
mod common;

use rina_lab::backend::sim::{Engine, Sim};
use rina_lab::backend::{self, RunCtx};
use rina_lab::results::{ClassSummary, RunOutput};
use rina_lab::{load, Experiment};
use std::sync::atomic::AtomicBool;
use std::time::Duration;

fn example(name: &str) -> String {
    let p = format!("{}/../../examples/lab/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{p}: {e}"))
}

fn run(exp: &Experiment) -> RunOutput {
    let dir = std::env::temp_dir().join(format!(
        "rina-lab-sim-test-{}-{}",
        exp.name,
        exp.variant.as_deref().unwrap_or("")
    ));
    let stop = AtomicBool::new(false);
    let progress = |_: f64, _: &str| {};
    let ctx = RunCtx {
        dir: &dir,
        progress: &progress,
        stop: &stop,
    };
    let mut sim = Sim::default();
    let t = std::time::Instant::now();
    let (out, _) = backend::run(&mut sim, exp, &ctx).unwrap();
    println!(
        "{} [{:?}]: {} events (last run) in {:.2} s wall (all runs)",
        exp.name,
        exp.variant,
        sim.last_events,
        t.elapsed().as_secs_f64()
    );
    print!("{}", out.summary_table());
    out
}

fn class(out: &RunOutput, c: &str) -> ClassSummary {
    out.summary()
        .into_iter()
        .find(|x| x.class == c)
        .unwrap_or_else(|| panic!("no class {c}"))
}

fn flow<'a>(out: &'a RunOutput, id: &str) -> &'a rina_lab::results::FlowRecord {
    out.flows
        .iter()
        .find(|f| f.flow == id)
        .unwrap_or_else(|| panic!("no flow {id}"))
}

/// Every shipped example, every variant, at its full length and rates,
/// runs on the stack (the protocol engine) unless the queueing model is
/// asked for; twenty times the traffic of seed 003 goes to the model,
/// saying why.
#[test]
fn every_example_runs_in_the_protocol_engine_by_itself() {
    let all = common::every_example();
    assert!(all.len() >= 15, "{}", all.len());
    for (f, v, exp) in all {
        // Seed 003 at the paper's ten minutes too, every variant.
        let long = f
            .ends_with("metro-37.toml")
            .then(|| exp.clone().shortened(Duration::from_secs(600)));
        for e in std::iter::once(exp).chain(long) {
            let (engine, why) = Engine::choose(&e, None).unwrap();
            assert_eq!(
                engine,
                Engine::Protocol,
                "{f:?} {v:?} {:?}: {why}",
                e.duration
            );
        }
    }
    let metro = load(&example("metro-37.toml"), Some("spn-mr-90")).unwrap();
    let (engine, why) = Engine::choose(&metro.clone().scaled(20.0), None).unwrap();
    assert_eq!(engine, Engine::Queueing);
    assert!(
        why.contains("Gbit") && why.contains("--engine protocol"),
        "{why}"
    );
    let (engine, _) = Engine::choose(&metro.scaled(20.0), Some(Engine::Protocol)).unwrap();
    assert_eq!(engine, Engine::Protocol);
}

#[test]
fn metro_37_calibration_loads_the_core_to_the_target() {
    // The protocol engine, picked by itself at the paper's rates; seed
    // 003's patterns are tested in seeds_qos.rs.
    let text = example("metro-37.toml");
    let out = run(&load(&text, Some("spn-mr-90"))
        .unwrap()
        .shortened(Duration::from_secs(3)));
    let core: Vec<_> = out
        .links
        .iter()
        .filter(|l| l.link.starts_with("ir-") && l.link.contains("--ir-"))
        .filter(|l| l.avg_bps_ab.max(l.avg_bps_ba) > 0.0)
        .collect();
    assert!(!core.is_empty());
    for l in core {
        let load = l.avg_bps_ab.max(l.avg_bps_ba) / l.rate_bps;
        assert!(load > 0.8 && load < 0.95, "{}: load {load}", l.link);
    }
}

#[test]
fn line_3_rtt_rises_with_hops_and_every_tgen_sdu_arrives() {
    let out = run(&load(&example("line-3.toml"), None).unwrap());
    let a = flow(&out, "t0.echo.a>echo.c");
    let b = flow(&out, "t0.echo.b>echo.c");
    assert_eq!((a.hops, b.hops), (Some(2), Some(1)));
    assert!(a.rtt_avg_ms.unwrap() > b.rtt_avg_ms.unwrap());
    let cbr = class(&out, "cbr-2M");
    assert!(cbr.sent >= 950, "{}", cbr.sent); // 2 Mb/s of 1000-byte SDUs for 4 s
    assert_eq!(cbr.received, cbr.sent);
    let gp: Vec<f64> = out.goodput.iter().map(|g| g.goodput_bps).collect();
    assert_eq!(gp.len(), 4);
    assert!(gp[0] < gp[3] && gp[3] < 100e6, "{gp:?}");
}

#[test]
fn routing_rtt_grows_with_hop_count() {
    let exp = load(&example("routing-rtt.toml"), None)
        .unwrap()
        .shortened(Duration::from_secs(6));
    let out = run(&exp);
    let mut by_hops: std::collections::BTreeMap<u32, Vec<f64>> = Default::default();
    for f in &out.flows {
        assert_eq!(f.received, f.sent, "{}", f.flow);
        by_hops
            .entry(f.hops.unwrap())
            .or_default()
            .push(f.rtt_avg_ms.unwrap());
    }
    let means: Vec<f64> = by_hops
        .values()
        .map(|v| v.iter().sum::<f64>() / v.len() as f64)
        .collect();
    assert!(means.len() >= 3);
    assert!(means.windows(2).all(|w| w[0] < w[1]), "{means:?}");
}

#[test]
fn location_the_unchanged_client_reaches_the_server_at_its_new_place() {
    let exp = load(&example("location.toml"), None)
        .unwrap()
        .shortened(Duration::from_secs(4));
    let out = run(&exp);
    let before = flow(&out, "t0.echo.a>server");
    let after = flow(&out, "t0.echo.a>server#2");
    assert_eq!(before.served_by.as_deref(), Some("d"));
    assert_eq!(after.served_by.as_deref(), Some("f"));
    assert!(before.received > 10 && after.received > 10);
}

#[test]
fn goodput_grows_with_sdu_size_and_each_layer_costs() {
    let exp = load(&example("goodput-sdu.toml"), None)
        .unwrap()
        .shortened(Duration::from_secs_f64(3.6));
    let out = run(&exp);
    let at = |series: &str, size: usize| {
        out.goodput
            .iter()
            .find(|g| g.series == series && g.sdu_bytes == size)
            .unwrap_or_else(|| panic!("no point {series} {size}"))
            .goodput_bps
    };
    let series = ["over the shim", "over 1 normal DIF", "over 2 normal DIFs"];
    for s in series {
        assert!(at(s, 100) < at(s, 1400), "{s}");
        assert!(at(s, 1400) < 1e9, "{s}");
    }
    // A writer straight on the link shim fills the 1 Gb/s link (it was
    // woken only by its own node's events, ~900 SDUs/s).
    assert!(at(series[0], 1400) > 0.9e9, "{}", at(series[0], 1400));
    for size in [100, 500, 1400] {
        assert!(at(series[0], size) > at(series[1], size), "{size}");
        assert!(at(series[1], size) > at(series[2], size), "{size}");
    }
}

#[test]
fn qos_2_urgent_first_with_qta_mux_and_not_with_fifo_one_dif_and_a_stack() {
    for file in ["qos-2.toml", "qos-2-stack.toml"] {
        let qta = run(&common::qos_2(file, "qta"));
        let fifo = run(&common::qos_2(file, "fifo"));
        assert!(qta
            .timeline
            .iter()
            .any(|t| t.what.starts_with("engine: protocol")));
        common::check_qos_2(&format!("sim {file}"), &qta, &fifo);
    }
}

#[test]
fn cc_loss_reliable_perf_retransmits_and_slows_down_with_loss() {
    // The protocol engine: EFCP retransmits what the lossy links drop, and
    // its congestion control takes the losses as congestion.
    let out = run(&load(&example("cc-loss.toml"), None).unwrap());
    assert!(out
        .timeline
        .iter()
        .any(|t| t.what.starts_with("engine: protocol")));
    let at = |class: &str| {
        let f = out.flows.iter().find(|f| f.class == class).unwrap();
        assert!(f.error.is_none() && f.sent > 100, "{f:?}");
        assert_eq!(f.received, f.sent, "{f:?}");
        f.goodput_bps
    };
    let (five, twenty) = (at("reliable, 5 % loss"), at("reliable, 20 % loss"));
    assert!(twenty < five && five < 10e6 * 0.97, "{five} {twenty}");
    assert!(twenty > 0.5e6, "{twenty}");
}
