//! Helpers of the `local` and `netns` tests.

#![allow(dead_code)]

use rina_lab::backend::{Backend, RunCtx};
use rina_lab::results::RunOutput;
use rina_lab::Experiment;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Once;

/// `examples/lab/<name>`.
pub fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/lab")
        .join(name)
}

/// Every shipped example and variant (the base experiment of a file
/// without variants), resolved: (file, variant, experiment), in file
/// order.
pub fn every_example() -> Vec<(PathBuf, Option<String>, Experiment)> {
    let mut paths: Vec<_> = std::fs::read_dir(example(""))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    paths.sort();
    let mut out = Vec::new();
    for p in paths {
        let text = std::fs::read_to_string(&p).unwrap();
        let file =
            rina_lab::resolve::parse(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        let mut variants: Vec<Option<String>> = rina_lab::resolve::variant_names(&file)
            .into_iter()
            .map(Some)
            .collect();
        if variants.is_empty() {
            variants.push(None);
        }
        for v in variants {
            let e = rina_lab::load(&text, v.as_deref())
                .unwrap_or_else(|e| panic!("{} [{v:?}]: {e}", p.display()));
            out.push((p.clone(), v, e));
        }
    }
    out
}

/// The target folder of this test binary (`target/<profile>`).
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().to_path_buf()
}

/// Builds `rinad` and the tools into this target folder if they are not there.
pub fn ensure_binaries() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let dir = profile_dir();
        let have = ["rinad", "rina-echo", "rina-tgen", "rina-perf", "rinactl"]
            .iter()
            .all(|b| dir.join(b).is_file());
        if have {
            return;
        }
        let release = dir.file_name().is_some_and(|n| n == "release");
        let target = dir.parent().unwrap();
        let mut c = std::process::Command::new(std::env::var("CARGO").unwrap_or("cargo".into()));
        c.args(["build", "-p", "rinad", "-p", "rina-tools"])
            .env("CARGO_TARGET_DIR", target);
        if release {
            c.arg("--release");
        }
        let st = c.status().expect("cargo runs");
        assert!(st.success(), "building rinad and the tools failed");
    });
}

/// A fresh run folder under the target folder.
pub fn run_dir(name: &str) -> PathBuf {
    let d = profile_dir().join("rina-lab-tests").join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Runs `exp` once on `be` and writes its result files.
pub fn run(be: &mut dyn Backend, exp: &Experiment, dir: &Path) -> RunOutput {
    let stop = AtomicBool::new(false);
    let progress = |_: f64, _: &str| {};
    let ctx = RunCtx {
        dir,
        progress: &progress,
        stop: &stop,
    };
    let out = be
        .run_once(exp, &ctx)
        .unwrap_or_else(|e| panic!("run failed: {e} (files in {})", dir.display()));
    out.write(dir).unwrap();
    print!("{}", out.summary_table());
    out
}

/// What line-3 must show on a real backend.
pub fn check_line_3(out: &RunOutput, dir: &Path) {
    check_line_3_links(out, dir, true)
}

/// What line-3 must show on a real backend; with `emulated` false the
/// links are the machines' (the ssh backend over shim-udp): their 1 ms
/// delays are not added and their load is not counted.
pub fn check_line_3_links(out: &RunOutput, dir: &Path, emulated: bool) {
    for f in &out.flows {
        println!(
            "{:<32} {:>5} sent {:>6} recv {:>6} delay min/avg/max {:?}/{:?}/{:?} ms goodput {:.0} b/s hops {:?} err {:?}",
            f.flow, f.kind, f.sent, f.received, f.delay_min_ms, f.delay_avg_ms, f.delay_max_ms,
            f.goodput_bps, f.hops, f.error
        );
    }
    for g in &out.goodput {
        println!("goodput {} B: {:.2} Mb/s", g.sdu_bytes, g.goodput_bps / 1e6);
    }
    // Every client said how long its flow's allocation took.
    for f in &out.flows {
        let ms = f.allocation_ms.unwrap_or_else(|| panic!("{f:?}"));
        assert!(ms > 0.0 && ms < 10_000.0, "{f:?}");
    }
    // Echo from a (two 1 ms links to c) and from b (one link).
    let echo = |src: &str| {
        out.flows
            .iter()
            .find(|f| f.kind == "echo" && f.src == src)
            .unwrap_or_else(|| panic!("no echo flow from {src}"))
    };
    let (ea, eb) = (echo("a"), echo("b"));
    for e in [ea, eb] {
        assert_eq!(e.error, None, "{e:?}");
        // In the shortened run the perf sweep overlaps the probes and
        // fills the links' queues, so probes may be lost then; a good
        // part comes back (figures depend on the machine's load).
        assert!(e.received > 0 && e.received * 4 >= e.sent, "{e:?}");
        assert_eq!(e.served_by.as_deref(), Some("c"));
    }
    assert_eq!((ea.hops, eb.hops), (Some(2), Some(1)));
    let rtt_a = 2.0 * ea.delay_min_ms.unwrap();
    let rtt_b = 2.0 * eb.delay_min_ms.unwrap();
    println!("echo RTT min: a->c {rtt_a:.3} ms, b->c {rtt_b:.3} ms");
    if emulated {
        assert!(rtt_a >= 4.0, "a->c RTT {rtt_a} ms below 2 x 2 x 1 ms");
        assert!(rtt_b >= 2.0, "b->c RTT {rtt_b} ms below 2 x 1 ms");
        assert!(
            rtt_a > rtt_b,
            "two hops ({rtt_a} ms) not slower than one ({rtt_b} ms)"
        );
    }
    // tgen a -> c: CBR 2 Mb/s delivered (but what the perf sweep's queues
    // drop), one-way delay above the links' 2 ms.
    let t = out
        .flows
        .iter()
        .find(|f| f.kind == "tgen")
        .expect("tgen flow");
    assert_eq!(t.error, None, "{t:?}");
    assert!(t.sent > 0 && t.received * 4 >= t.sent, "{t:?}");
    assert!(
        t.delay_min_ms.unwrap() >= if emulated { 2.0 } else { 0.0 },
        "{t:?}"
    );
    assert!((0.3e6..2.5e6).contains(&t.goodput_bps), "{t:?}");
    // perf over the reliable cube: flow control paces it to the path, so
    // everything written arrives.
    let p = out
        .flows
        .iter()
        .find(|f| f.kind == "perf")
        .expect("perf flow");
    assert_eq!(p.error, None, "{p:?}");
    assert!(p.sent > 0 && p.received == p.sent, "{p:?}");
    assert_eq!(p.cube, "reliable");
    // perf: a goodput point per SDU size, bounded by the 100 Mb/s links.
    let sizes: Vec<usize> = out.goodput.iter().map(|g| g.sdu_bytes).collect();
    assert_eq!(sizes, vec![200, 500, 1000, 1400]);
    assert!(out.goodput.iter().all(|g| g.goodput_bps > 0.0));
    assert!(
        out.goodput.iter().all(|g| g.goodput_bps < 100e6),
        "{:?}",
        out.goodput
    );
    // Link load was counted and the files parse back.
    assert_eq!(out.links.len(), 2);
    if emulated {
        assert!(out.links.iter().all(|l| l.avg_bps_ab > 0.0));
    }
    let back = RunOutput::read(dir).unwrap();
    let ids = |o: &RunOutput| o.flows.iter().map(|f| f.flow.clone()).collect::<Vec<_>>();
    assert_eq!(ids(&back), ids(out));
    assert_eq!(back.goodput.len(), out.goodput.len());
    assert!(dir.join("logs/a.log").is_file());
}

/// a - b - c with `delay_ms` links (the second losing `loss`), echo from a
/// to an application at c every 20 ms for 3 s.
pub fn echo_experiment(delay_ms: u32, loss: f64) -> String {
    format!(
        r#"
nodes = ["a", "b", "c"]
[experiment]
name = "delay-loss"
duration = "3s"
seed = 7
[[link]]
between = ["a", "b"]
delay = "{delay_ms}ms"
[[link]]
between = ["b", "c"]
delay = "{delay_ms}ms"
loss = {loss}
[[dif]]
name = "net"
members = ["*"]
over = ["links"]
[[app]]
name = "echo.c"
node = "c"
dif = "net"
[[traffic]]
kind = "echo"
dif = "net"
from = ["a"]
app = "echo.c"
interval = "20ms"
"#
    )
}

/// `examples/lab/<file>` in variant `v`, shortened to 3 s of traffic.
pub fn qos_2(file: &str, v: &str) -> Experiment {
    let text = std::fs::read_to_string(example(file)).unwrap();
    rina_lab::load(&text, Some(v))
        .unwrap()
        .shortened(std::time::Duration::from_secs(3))
}

/// The pattern `examples/lab/qos-2*.toml` exists to show, on any backend:
/// with QTA-Mux the urgent class's mean delay stays within 3x its unloaded
/// delay (its minimum: a PDU that found the queues empty) and it loses
/// nothing, while best effort queues and loses; with FIFO both classes see
/// the same delay.
pub fn check_qos_2(what: &str, qta: &RunOutput, fifo: &RunOutput) {
    let class = |out: &RunOutput, c: &str| {
        out.summary()
            .into_iter()
            .find(|x| x.class == c)
            .unwrap_or_else(|| panic!("{what}: no class {c}"))
    };
    let (u, b) = (class(qta, "urgent"), class(qta, "best-effort"));
    let (umin, uavg, bavg) = (u.min_ms.unwrap(), u.avg_ms.unwrap(), b.avg_ms.unwrap());
    println!("{what} qta: urgent min {umin:.2} avg {uavg:.2} p99 {:.2} ms loss {:.1} %; best effort avg {bavg:.2} ms loss {:.1} %", urgent_p99(qta), u.loss_pct, b.loss_pct);
    assert!(
        uavg < 3.0 * umin,
        "{what} qta: urgent avg {uavg} ms, unloaded {umin} ms"
    );
    assert_eq!(u.loss_pct, 0.0, "{what} qta: urgent lost SDUs");
    assert!(
        bavg > 5.0 * uavg,
        "{what} qta: best effort {bavg} ms vs urgent {uavg} ms"
    );
    assert!(
        b.loss_pct > 5.0,
        "{what} qta: best effort loss {}",
        b.loss_pct
    );
    let (u, b) = (class(fifo, "urgent"), class(fifo, "best-effort"));
    let (uavg, bavg) = (u.avg_ms.unwrap(), b.avg_ms.unwrap());
    println!("{what} fifo: urgent avg {uavg:.2} ms loss {:.1} %; best effort avg {bavg:.2} ms loss {:.1} %", u.loss_pct, b.loss_pct);
    assert!(
        uavg > 3.0 * umin,
        "{what} fifo: urgent did not queue ({uavg} ms)"
    );
    assert!(
        (uavg / bavg - 1.0).abs() < 0.2,
        "{what} fifo: urgent {uavg} ms vs best effort {bavg} ms"
    );
}

/// The 99th percentile of the urgent class's delay samples of `out`, ms
/// (printed beside the mean: a tail the mean hides).
fn urgent_p99(out: &RunOutput) -> f64 {
    let mut d: Vec<f64> = out
        .samples
        .iter()
        .filter(|s| s.class == "urgent")
        .map(|s| s.delay_ms)
        .collect();
    rina_lab::results::stats_ms(&mut d).map_or(f64::NAN, |(_, _, p99, _)| p99)
}

/// Per perf flow of a run: (goodput b/s, duplicates, out of order), from
/// the clients' reports in `dir/out`. Panics on a flow that failed or
/// lost SDUs (a reliable flow delivers every SDU).
pub fn reliable_perf_flows(out: &RunOutput, dir: &Path) -> Vec<f64> {
    let mut rates = Vec::new();
    for f in out.flows.iter().filter(|f| f.kind == "perf") {
        println!(
            "{:<40} sent {:>6} recv {:>6} goodput {:6.2} Mb/s err {:?}",
            f.flow,
            f.sent,
            f.received,
            f.goodput_bps / 1e6,
            f.error
        );
        assert_eq!(f.error, None, "{} did not complete", f.flow);
        assert!(f.sent > 0 && f.received == f.sent, "{f:?}");
        rates.push(f.goodput_bps);
    }
    // Every SDU once and in order, as the server counted them.
    let mut reports = 0;
    for e in std::fs::read_dir(dir.join("out")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "json") {
            let v: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
            for t in v["tests"].as_array().unwrap() {
                let r = &t["report"];
                assert_eq!(r["duplicates"], 0, "{}: duplicates", p.display());
                assert_eq!(r["out_of_order"], 0, "{}: out of order", p.display());
                reports += 1;
            }
        }
    }
    assert_eq!(reports, rates.len(), "a report per flow");
    rates
}

/// Jain's fairness index of `x`.
pub fn jain(x: &[f64]) -> f64 {
    let s: f64 = x.iter().sum();
    let q: f64 = x.iter().map(|v| v * v).sum();
    s * s / (x.len() as f64 * q)
}

/// A class's summary row.
pub fn class(out: &RunOutput, c: &str) -> rina_lab::results::ClassSummary {
    out.summary()
        .into_iter()
        .find(|x| x.class == c)
        .unwrap_or_else(|| panic!("no class {c}"))
}

/// Seed 004's Table 3 and cube cells (examples/lab/reference/home-isp.toml).
pub fn table_3() -> rina_lab::report::Reference {
    rina_lab::report::Reference::read(&example("reference/home-isp.toml")).unwrap()
}

/// Seed 004: the aggregate measured rate of every urgency and cherish
/// level, cumulated from the highest, stays within Table 3 (plus what one
/// level's maximum backlog, 12500 bytes, adds over the run).
pub fn check_table_3(what: &str, out: &RunOutput) {
    check_table_3_scaled(what, out, 1.0)
}

/// [`check_table_3`] with the limits multiplied by `f`.
pub fn check_table_3_scaled(what: &str, out: &RunOutput, f: f64) {
    let r = table_3();
    assert_eq!(r.limit.len(), 6);
    let slack = 12_500.0 * 8.0 / out.duration_s;
    for l in &r.limit {
        let rates = rina_lab::report::level_rates(out, &r.cells, l.dimension);
        let sum: f64 = rates.iter().take(l.level + 1).sum();
        assert!(
            sum > 0.0 && sum <= l.bps * f + slack,
            "{what}: {:?} levels 0..={}: {} Mb/s, limit {}",
            l.dimension,
            l.level,
            sum / 1e6,
            l.bps * f / 1e6
        );
    }
}
