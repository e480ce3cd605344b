//! Plots of a synthetic run: every plot with data is written as a valid PNG
//! and an SVG that names what it shows; plots without data are skipped.

use rina_lab::plot::{plot_compare, plot_run};
use rina_lab::results::{FlowRecord, GoodputPoint, RunOutput, Sample};
use std::path::{Path, PathBuf};

const PNG_SIGNATURE: [u8; 8] = [0x89, b'P', b'N', b'G', b'\r', b'\n', 0x1a, b'\n'];

fn tmp(name: &str) -> PathBuf {
    // Kept after the test, to be looked at.
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("plot-{name}"));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn flow(class: &str, kind: &str, hops: Option<u32>, rtt: Option<f64>) -> FlowRecord {
    FlowRecord {
        flow: format!("{kind}.{class}.{hops:?}"),
        kind: kind.into(),
        class: class.into(),
        sent: 100,
        received: 99,
        delay_min_ms: Some(0.5),
        delay_avg_ms: Some(rtt.unwrap_or(2.0) / 2.0),
        delay_max_ms: Some(9.0),
        hops,
        rtt_avg_ms: rtt,
        ..Default::default()
    }
}

fn synthetic(variant: &str, scale: f64) -> RunOutput {
    let mut samples = Vec::new();
    for i in 0..500 {
        let x = 0.1 + i as f64 / 50.0;
        samples.push(Sample {
            class: "Gold voice".into(),
            delay_ms: x * scale,
        });
        samples.push(Sample {
            class: "BestEffort bulk".into(),
            delay_ms: 10.0 * x * scale,
        });
    }
    // A zero delay must not break the log axis.
    samples.push(Sample {
        class: "Gold voice".into(),
        delay_ms: 0.0,
    });
    let goodput = [200, 500, 1000, 1400]
        .iter()
        .flat_map(|&s| {
            [("over the shim", 1.0), ("over 1 normal DIF", 0.8)].map(|(n, f)| GoodputPoint {
                series: n.into(),
                sdu_bytes: s,
                goodput_bps: f * s as f64 * 1e5,
            })
        })
        .collect();
    RunOutput {
        backend: "sim".into(),
        experiment: "synthetic".into(),
        variant: Some(variant.into()),
        duration_s: 10.0,
        flows: vec![
            flow("Gold voice", "tgen", None, None),
            flow("BestEffort bulk", "tgen", None, None),
            flow("probe", "echo", Some(1), Some(2.1 * scale)),
            flow("probe", "echo", Some(1), Some(2.3 * scale)),
            flow("probe", "echo", Some(3), Some(6.2 * scale)),
        ],
        samples,
        goodput,
        ..Default::default()
    }
}

fn assert_png(p: &Path) {
    let b = std::fs::read(p).unwrap();
    assert!(b.len() > 1000, "{}: {} bytes", p.display(), b.len());
    assert_eq!(b[..8], PNG_SIGNATURE, "{}", p.display());
}

fn svg(p: &Path) -> String {
    let s = std::fs::read_to_string(p).unwrap();
    assert!(
        s.contains("<svg") && s.trim_end().ends_with("</svg>"),
        "{}",
        p.display()
    );
    s
}

#[test]
fn run_plots_are_png_and_svg_naming_the_classes() {
    let dir = tmp("run");
    let files = plot_run(&synthetic("spn+mr", 1.0), &dir).unwrap();
    assert_eq!(files.len(), 6, "{files:?}");
    for f in files.iter().filter(|f| f.extension().unwrap() == "png") {
        assert_png(f);
    }
    let cdf = svg(&dir.join("delay_cdf.svg"));
    assert!(cdf.contains("Gold voice") && cdf.contains("BestEffort bulk"));
    let g = svg(&dir.join("goodput_sdu.svg"));
    assert!(g.contains("over the shim") && g.contains("over 1 normal DIF"));
    let r = svg(&dir.join("rtt_hops.svg"));
    assert!(r.contains("mean per hop count") && r.contains("hops"));
}

#[test]
fn plots_without_data_are_skipped() {
    let dir = tmp("empty");
    assert!(plot_run(&RunOutput::default(), &dir).unwrap().is_empty());
    assert!(!dir.exists());
    // Only perf data: only the goodput plot.
    let mut run = synthetic("x", 1.0);
    run.samples.clear();
    run.flows.clear();
    let files = plot_run(&run, &dir).unwrap();
    let names: Vec<_> = files
        .iter()
        .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["goodput_sdu.png", "goodput_sdu.svg"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn comparison_names_every_run_and_class() {
    let dir = tmp("compare");
    let runs = [synthetic("spn", 3.0), synthetic("spn+mr", 1.0)];
    let files = plot_compare(&runs, &dir).unwrap();
    assert_eq!(files.len(), 4, "{files:?}");
    assert_png(&dir.join("compare_delay.png"));
    assert_png(&dir.join("compare_delay_cdf.png"));
    for f in ["compare_delay.svg", "compare_delay_cdf.svg"] {
        let s = svg(&dir.join(f));
        for name in ["spn", "spn+mr", "Gold voice", "BestEffort bulk"] {
            assert!(s.contains(name), "{f} lacks {name}");
        }
    }
}

/// A run of class `c` with a delay of 1 ms and one of `delay_ms`, in its
/// samples, its mean and an echo flow's RTT.
fn with_delay(variant: &str, delay_ms: f64) -> RunOutput {
    RunOutput {
        backend: "sim".into(),
        experiment: "x".into(),
        variant: Some(variant.into()),
        duration_s: 1.0,
        flows: vec![
            FlowRecord {
                flow: "f".into(),
                kind: "tgen".into(),
                class: "c".into(),
                sent: 2,
                received: 2,
                delay_avg_ms: Some(delay_ms),
                ..Default::default()
            },
            flow("probe", "echo", Some(1), Some(1.0)),
            flow("probe", "echo", Some(2), Some(delay_ms)),
        ],
        samples: vec![
            Sample {
                class: "c".into(),
                delay_ms: 1.0,
            },
            Sample {
                class: "c".into(),
                delay_ms,
            },
        ],
        ..Default::default()
    }
}

/// The texts of an SVG file.
fn texts(svg: &str) -> Vec<String> {
    svg.split("<text")
        .skip(1)
        .filter_map(|t| {
            let t = &t[t.find('>')? + 1..];
            Some(t[..t.find("</text>")?].trim().to_string())
        })
        .collect()
}

/// Runs `f` on a thread of its own and gives it `secs` to return, so that
/// a plot that never ends fails the test instead of hanging it.
fn within<T: Send + 'static>(secs: u64, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(std::time::Duration::from_secs(secs)) {
        Ok(v) => v,
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => panic!("still drawing after {secs} s"),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => panic!("plotting panicked"),
    }
}

#[test]
fn a_huge_finite_delay_is_left_out_of_the_run_plots_which_are_drawn() {
    // Its axis ended at 1.7e308 × 1.25 = inf: plotting hung for ever.
    let dir = tmp("huge");
    let d = dir.clone();
    let files = within(60, move || plot_run(&with_delay("a", 1.7e308), &d)).unwrap();
    assert_eq!(files.len(), 4, "{files:?}");
    for f in files.iter().filter(|f| f.extension().unwrap() == "png") {
        assert_png(f);
    }
    let cdf = svg(&dir.join("delay_cdf.svg"));
    assert!(cdf.contains("c (n=1)"), "the huge sample is drawn");
    // The RTT plot's axis holds the 1 ms probe, not the huge one.
    let rtt = texts(&svg(&dir.join("rtt_hops.svg")));
    let mut numbers = rtt.iter().filter_map(|t| t.parse::<f64>().ok());
    assert!(numbers.all(|v| v.abs() <= 1e12), "{rtt:?}");
}

#[test]
fn a_huge_finite_mean_delay_is_left_out_of_the_comparison_which_is_drawn() {
    // Its log axis ended at log10(2e308) = inf: drawing panicked.
    let dir = tmp("huge-compare");
    let d = dir.clone();
    let runs = [with_delay("huge", 1e308), with_delay("small", 1.0)];
    let files = within(60, move || plot_compare(&runs, &d)).unwrap();
    assert_eq!(files.len(), 4, "{files:?}");
    assert_png(&dir.join("compare_delay.png"));
    let bars = texts(&svg(&dir.join("compare_delay.svg")));
    for name in ["huge", "small", "c"] {
        assert!(bars.iter().any(|t| t == name), "no {name} in {bars:?}");
    }
    // The mean of run "small" in class c is drawn (1 ms), that of run
    // "huge" is not: no label holds a number beyond any axis.
    assert!(bars.iter().any(|t| t == "1"), "{bars:?}");
    let mut numbers = bars.iter().filter_map(|t| t.parse::<f64>().ok());
    assert!(numbers.all(|v| v.abs() <= 1e12), "{bars:?}");
    let cdf = svg(&dir.join("compare_delay_cdf.svg"));
    assert!(
        cdf.contains("huge (n=1)") && cdf.contains("small (n=2)"),
        "{cdf}"
    );
}
