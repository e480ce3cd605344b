//! What a run produces and how it is written: per-flow records, delay
//! samples (for CDFs), goodput points, per-link load, and the timeline, as
//! CSV and JSON in the run's folder; and the terminal summary table per
//! traffic class (seed 003 Table II's columns).
//!
//! The schema of every file is in `docs/rina-lab.md` ("Results"); the
//! structs below are that schema (field = column).

use crate::LabError;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::Path;

/// Version of the result files' schema (in `run.json`).
pub const SCHEMA_VERSION: u32 = 1;

/// Everything one run measured.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct RunOutput {
    /// `local`, `netns` or `sim`.
    pub backend: String,
    /// Experiment name.
    pub experiment: String,
    /// Variant, if any.
    pub variant: Option<String>,
    /// Wall-clock time the run took, s.
    pub wall_time_s: f64,
    /// Experiment time covered, s.
    pub duration_s: f64,
    /// One record per flow (per allocation).
    pub flows: Vec<FlowRecord>,
    /// Delay samples (bounded per class) for CDFs.
    pub samples: Vec<Sample>,
    /// Goodput against SDU size (perf traffic).
    pub goodput: Vec<GoodputPoint>,
    /// Load of every link.
    pub links: Vec<LinkRecord>,
    /// What happened when (allocations, events, failures).
    pub timeline: Vec<TimelineEntry>,
    /// The experiment ran in time dilated by `1/dilation` (`run --dilate`):
    /// its delays are the original's over `dilation`, its rates the
    /// original's times `dilation` ([`RunOutput::in_original_time`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dilation: Option<f64>,
}

/// One flow (one allocation) and what it measured.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct FlowRecord {
    /// Flow id from the experiment (`t0.voip.pe-0-0>hr-0-1-0`); a flow
    /// allocated again gets `#2`, `#3` appended.
    pub flow: String,
    /// `tgen`, `echo` or `perf`.
    pub kind: String,
    /// Traffic class (summary row).
    pub class: String,
    /// DIF.
    pub dif: String,
    /// QoS cube name.
    pub cube: String,
    /// Sending node.
    pub src: String,
    /// Destination (node or application name).
    pub dst: String,
    /// Node that served the flow (where the destination application was).
    pub served_by: Option<String>,
    /// Hops between the ends in the flow's DIF.
    pub hops: Option<u32>,
    /// SDU size, bytes (mean for variable sizes).
    pub sdu_bytes: f64,
    /// SDUs sent.
    pub sent: u64,
    /// SDUs received (echo: replies).
    pub received: u64,
    /// Lost SDUs, percent of sent.
    pub loss_pct: f64,
    /// One-way delay (echo: RTT / 2), milliseconds: minimum.
    pub delay_min_ms: Option<f64>,
    /// Mean.
    pub delay_avg_ms: Option<f64>,
    /// 99th percentile.
    pub delay_p99_ms: Option<f64>,
    /// Maximum.
    pub delay_max_ms: Option<f64>,
    /// Echo: mean round-trip time, ms.
    pub rtt_avg_ms: Option<f64>,
    /// Received payload bit/s over the flow's active time.
    pub goodput_bps: f64,
    /// Time from the allocation request to the response, ms.
    pub allocation_ms: Option<f64>,
    /// Why the flow failed, if it did.
    pub error: Option<String>,
}

/// A delay sample.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Sample {
    /// Class.
    pub class: String,
    /// One-way delay (echo: RTT / 2), ms.
    pub delay_ms: f64,
}

/// Goodput at one SDU size.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct GoodputPoint {
    /// Series (the class of the perf traffic, e.g. "over 1 normal DIF").
    pub series: String,
    /// SDU size, bytes.
    pub sdu_bytes: usize,
    /// Goodput, bit/s.
    pub goodput_bps: f64,
}

/// Load of one link.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct LinkRecord {
    /// Link name.
    pub link: String,
    /// Rate it ran at, bit/s.
    pub rate_bps: f64,
    /// Average bit/s from the first end to the second (frames sent).
    pub avg_bps_ab: f64,
    /// Average bit/s the other way.
    pub avg_bps_ba: f64,
    /// Frames dropped by the link (queue full or random loss).
    pub dropped: u64,
}

/// A line of the timeline.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TimelineEntry {
    /// Seconds from the start of traffic (negative during warm-up).
    pub t_s: f64,
    /// What happened.
    pub what: String,
}

/// Figures of one class, over its flows.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ClassSummary {
    /// Class.
    pub class: String,
    /// Flows in the class.
    pub flows: usize,
    /// SDUs sent.
    pub sent: u64,
    /// SDUs received.
    pub received: u64,
    /// Minimum delay, ms.
    pub min_ms: Option<f64>,
    /// Mean delay (weighted by received SDUs), ms.
    pub avg_ms: Option<f64>,
    /// Maximum delay, ms.
    pub max_ms: Option<f64>,
    /// Loss, percent.
    pub loss_pct: f64,
    /// Goodput of the class: the sum of its flows' received payload bit/s
    /// (a perf flow's is the mean over its SDU sizes).
    #[serde(default)]
    pub goodput_bps: f64,
}

/// A run's wall time as the summaries print it: seconds to a tenth, or
/// milliseconds below a tenth of a second (a short simulation, which
/// printed "0.0 s wall time" as if nothing had run).
pub fn wall_time(s: f64) -> String {
    if s < 0.1 {
        format!("{:.0} ms", s * 1e3)
    } else {
        format!("{s:.1} s")
    }
}

impl RunOutput {
    /// The run's figures brought back to the original experiment's time (a
    /// run made with `--dilate F`): delays times `F`, rates over `F`, the
    /// duration times `F`; loss and counts are unchanged. A run made
    /// without dilation is returned as it is.
    pub fn in_original_time(mut self) -> RunOutput {
        let Some(f) = self.dilation.take() else {
            return self;
        };
        let t = |x: &mut Option<f64>| {
            if let Some(v) = x {
                *v *= f;
            }
        };
        for r in &mut self.flows {
            t(&mut r.delay_min_ms);
            t(&mut r.delay_avg_ms);
            t(&mut r.delay_p99_ms);
            t(&mut r.delay_max_ms);
            t(&mut r.rtt_avg_ms);
            r.goodput_bps /= f;
        }
        for s in &mut self.samples {
            s.delay_ms *= f;
        }
        for g in &mut self.goodput {
            g.goodput_bps /= f;
        }
        for l in &mut self.links {
            l.rate_bps /= f;
            l.avg_bps_ab /= f;
            l.avg_bps_ba /= f;
        }
        self.duration_s *= f;
        self
    }

    /// Per-class figures, classes in the order they first appear.
    pub fn summary(&self) -> Vec<ClassSummary> {
        let mut order: Vec<String> = Vec::new();
        let mut by: BTreeMap<String, ClassSummary> = BTreeMap::new();
        let mut avgs: BTreeMap<String, Vec<(f64, u64)>> = BTreeMap::new();
        for f in &self.flows {
            if !by.contains_key(&f.class) {
                order.push(f.class.clone());
            }
            let c = by.entry(f.class.clone()).or_insert_with(|| ClassSummary {
                class: f.class.clone(),
                ..Default::default()
            });
            c.flows += 1;
            c.sent += f.sent;
            c.received += f.received;
            c.goodput_bps += f.goodput_bps;
            if let Some(m) = f.delay_min_ms {
                c.min_ms = Some(c.min_ms.map_or(m, |x| x.min(m)));
            }
            if let Some(m) = f.delay_max_ms {
                c.max_ms = Some(c.max_ms.map_or(m, |x| x.max(m)));
            }
            if let Some(a) = f.delay_avg_ms {
                avgs.entry(f.class.clone())
                    .or_default()
                    .push((a, f.received));
            }
        }
        order
            .into_iter()
            .map(|k| {
                let mut c = by.remove(&k).expect("class");
                if let Some(a) = avgs.get(&k) {
                    c.avg_ms = weighted_mean(a);
                }
                c.loss_pct = if c.sent == 0 {
                    0.0
                } else {
                    100.0 * c.sent.saturating_sub(c.received) as f64 / c.sent as f64
                };
                c
            })
            .collect()
    }

    /// Whether the run has echo probes in the QoS cube of some tgen class:
    /// then [`RunOutput::summary_probed`] differs from
    /// [`RunOutput::summary`].
    pub fn has_probes(&self) -> bool {
        self.flows.iter().any(|p| {
            p.kind == "echo"
                && self
                    .flows
                    .iter()
                    .any(|t| t.kind == "tgen" && t.cube == p.cube && t.dif == p.dif)
        })
    }

    /// Per-class figures the way seed 003's paper measured them: the
    /// delay of a tgen class from the echo probes in its QoS cube and DIF
    /// (RTT / 2 of probes sent every 100 ms, its `rina-echo-time`; the
    /// mean weighted by replies), its loss and goodput from its own
    /// traffic. A class without probes keeps its traffic's delay; the
    /// probes' own classes are left out. Smooth, low-rate probes see the
    /// queues as they are on average, where a bursty class's own SDUs see
    /// the queue its bursts build.
    pub fn summary_probed(&self) -> Vec<ClassSummary> {
        let probe_classes: BTreeSet<&str> = self
            .flows
            .iter()
            .filter(|f| f.kind == "echo")
            .map(|f| f.class.as_str())
            .collect();
        let mut rows = self.summary();
        rows.retain(|r| !probe_classes.contains(r.class.as_str()));
        for r in &mut rows {
            let Some(t) = self
                .flows
                .iter()
                .find(|f| f.class == r.class && f.kind == "tgen")
            else {
                continue;
            };
            let probes: Vec<&FlowRecord> = self
                .flows
                .iter()
                .filter(|p| p.kind == "echo" && p.cube == t.cube && p.dif == t.dif)
                .collect();
            if probes.is_empty() {
                continue;
            }
            let mins = probes.iter().filter_map(|p| p.delay_min_ms);
            let maxs = probes.iter().filter_map(|p| p.delay_max_ms);
            r.min_ms = mins.reduce(f64::min);
            r.max_ms = maxs.reduce(f64::max);
            let avgs: Vec<(f64, u64)> = probes
                .iter()
                .filter_map(|p| Some((p.delay_avg_ms?, p.received)))
                .collect();
            r.avg_ms = weighted_mean(&avgs);
        }
        rows
    }

    /// The summary as a terminal table.
    pub fn summary_table(&self) -> String {
        let rows = self.summary();
        let mut s = String::new();
        let title = match &self.variant {
            Some(v) => format!("{} [{}] on {}", self.experiment, v, self.backend),
            None => format!("{} on {}", self.experiment, self.backend),
        };
        let _ = writeln!(
            s,
            "{title}: {:.1} s of traffic in {} wall time",
            self.duration_s,
            wall_time(self.wall_time_s)
        );
        let _ = writeln!(
            s,
            "{:<22} {:>5} {:>10} {:>10} {:>10} {:>10} {:>10} {:>8} {:>8}",
            "class", "flows", "sent", "received", "min ms", "avg ms", "max ms", "loss %", "Mb/s"
        );
        let opt = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{v:.3}"));
        for r in rows {
            let _ = writeln!(
                s,
                "{:<22} {:>5} {:>10} {:>10} {:>10} {:>10} {:>10} {:>8.3} {:>8.3}",
                truncate(&r.class, 22),
                r.flows,
                r.sent,
                r.received,
                opt(r.min_ms),
                opt(r.avg_ms),
                opt(r.max_ms),
                r.loss_pct,
                r.goodput_bps / 1e6
            );
        }
        let failed = self.flows.iter().filter(|f| f.error.is_some()).count();
        if failed > 0 {
            let _ = writeln!(s, "{failed} flow(s) failed; see flows.csv (column `error`)");
        }
        s
    }

    /// Writes `run.json` (everything), `flows.csv`, `flows.json`,
    /// `samples.csv`, `goodput.csv`, `links.csv`, `timeline.csv` and
    /// `summary.txt` into `dir`.
    pub fn write(&self, dir: &Path) -> Result<(), LabError> {
        std::fs::create_dir_all(dir).map_err(|e| LabError::io(dir, e))?;
        let put = |name: &str, body: String| {
            let p = dir.join(name);
            std::fs::write(&p, body).map_err(|e| LabError::io(&p, e))
        };
        let json = |v: &dyn erased::Json| v.to_json();
        put(
            "run.json",
            serde_json::to_string_pretty(&RunFile {
                schema: SCHEMA_VERSION,
                run: self,
            })
            .expect("serialisable"),
        )?;
        put("flows.json", json(&self.flows))?;
        put("flows.csv", to_csv(&self.flows)?)?;
        put("samples.csv", to_csv(&self.samples)?)?;
        put("goodput.csv", to_csv(&self.goodput)?)?;
        put("links.csv", to_csv(&self.links)?)?;
        put("timeline.csv", to_csv(&self.timeline)?)?;
        put("summary.txt", self.summary_table())?;
        Ok(())
    }

    /// Reads a run back from its `run.json` (and checks the schema version).
    pub fn read(dir: &Path) -> Result<RunOutput, LabError> {
        let p = dir.join("run.json");
        let text = std::fs::read_to_string(&p).map_err(|e| LabError::io(&p, e))?;
        let v: RunFileOwned = serde_json::from_str(&text).map_err(|e| LabError::Backend {
            backend: "results",
            what: format!("{}: {e}", p.display()),
        })?;
        if v.schema != SCHEMA_VERSION {
            return Err(LabError::Backend {
                backend: "results",
                what: format!(
                    "{}: schema {} (this rina-lab reads {SCHEMA_VERSION})",
                    p.display(),
                    v.schema
                ),
            });
        }
        Ok(v.run)
    }
}

#[derive(Serialize)]
struct RunFile<'a> {
    schema: u32,
    run: &'a RunOutput,
}

#[derive(Deserialize)]
struct RunFileOwned {
    schema: u32,
    run: RunOutput,
}

mod erased {
    pub trait Json {
        fn to_json(&self) -> String;
    }
    impl<T: serde::Serialize> Json for T {
        fn to_json(&self) -> String {
            serde_json::to_string_pretty(self).expect("serialisable")
        }
    }
}

/// Rows as CSV with a header line (the field names).
pub fn to_csv<T: Serialize>(rows: &[T]) -> Result<String, LabError> {
    let mut w = csv::Writer::from_writer(Vec::new());
    for r in rows {
        w.serialize(r).map_err(|e| LabError::Backend {
            backend: "results",
            what: format!("csv: {e}"),
        })?;
    }
    let bytes = w.into_inner().map_err(|e| LabError::Backend {
        backend: "results",
        what: format!("csv: {e}"),
    })?;
    Ok(String::from_utf8(bytes).expect("csv is utf-8"))
}

/// Rows back from CSV.
pub fn from_csv<T: for<'de> Deserialize<'de>>(text: &str) -> Result<Vec<T>, String> {
    let mut r = csv::Reader::from_reader(text.as_bytes());
    r.deserialize()
        .map(|x| x.map_err(|e| e.to_string()))
        .collect()
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        s.chars().take(n - 1).collect::<String>() + "…"
    }
}

/// Mean of delays `a` weighted by counts `r`, `(a, r)`; `None` if the
/// counts add up to 0. Σ a·r / Σ r, or Σ a·(r / Σ r) where Σ a·r overflows:
/// the mean of huge finite delays is finite, not infinite.
fn weighted_mean(v: &[(f64, u64)]) -> Option<f64> {
    let n: f64 = v.iter().map(|&(_, r)| r as f64).sum();
    if n <= 0.0 {
        return None;
    }
    let s: f64 = v.iter().map(|&(a, r)| a * r as f64).sum();
    if s.is_finite() || !v.iter().all(|(a, _)| a.is_finite()) {
        return Some(s / n);
    }
    let m: f64 = v.iter().map(|&(a, r)| a * (r as f64 / n)).sum();
    // The weights' rounding must not take it past the largest delay.
    let weighted = v.iter().filter(|&&(_, r)| r > 0).map(|&(a, _)| a);
    let (lo, hi) = weighted.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), a| {
        (lo.min(a), hi.max(a))
    });
    Some(m.clamp(lo, hi))
}

/// Delay statistics of a set of samples, ms: (min, mean, p99, max).
pub fn stats_ms(samples: &mut [f64]) -> Option<(f64, f64, f64, f64)> {
    if samples.is_empty() {
        return None;
    }
    samples.sort_by(|a, b| a.total_cmp(b));
    let n = samples.len();
    let sum = samples.iter().sum::<f64>();
    let mean = if sum.is_finite() || !samples.iter().all(|s| s.is_finite()) {
        sum / n as f64
    } else {
        // Finite samples whose sum overflows: Σ s/n, within their range.
        let m = samples.iter().map(|s| s / n as f64).sum::<f64>();
        m.clamp(samples[0], samples[n - 1])
    };
    let p99 = samples[((n as f64 * 0.99).ceil() as usize).clamp(1, n) - 1];
    Some((samples[0], mean, p99, samples[n - 1]))
}

/// Keeps at most `cap` samples per class, chosen uniformly (reservoir
/// sampling, deterministic for a seed).
#[derive(Debug, Clone)]
pub struct Reservoir {
    cap: usize,
    seen: BTreeMap<String, u64>,
    kept: BTreeMap<String, Vec<f64>>,
    rng: rand_chacha::ChaCha8Rng,
}

impl Reservoir {
    /// At most `cap` samples per class.
    pub fn new(cap: usize, seed: u64) -> Self {
        use rand::SeedableRng;
        Reservoir {
            cap,
            seen: BTreeMap::new(),
            kept: BTreeMap::new(),
            rng: rand_chacha::ChaCha8Rng::seed_from_u64(seed),
        }
    }

    /// Offers a sample.
    pub fn offer(&mut self, class: &str, delay_ms: f64) {
        use rand::Rng;
        let n = self.seen.entry(class.to_string()).or_default();
        *n += 1;
        let kept = self.kept.entry(class.to_string()).or_default();
        if kept.len() < self.cap {
            kept.push(delay_ms);
        } else {
            let j = self.rng.gen_range(0..*n);
            if (j as usize) < self.cap {
                kept[j as usize] = delay_ms;
            }
        }
    }

    /// The kept samples.
    pub fn into_samples(self) -> Vec<Sample> {
        self.kept
            .into_iter()
            .flat_map(|(class, v)| {
                v.into_iter().map(move |d| Sample {
                    class: class.clone(),
                    delay_ms: d,
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(class: &str, sent: u64, received: u64, avg: f64) -> FlowRecord {
        FlowRecord {
            flow: format!("f-{class}-{sent}"),
            kind: "tgen".into(),
            class: class.into(),
            sent,
            received,
            delay_min_ms: Some(avg / 2.0),
            delay_avg_ms: Some(avg),
            delay_max_ms: Some(avg * 3.0),
            goodput_bps: sent as f64 * 1e4,
            ..Default::default()
        }
    }

    #[test]
    fn a_short_wall_time_is_in_milliseconds_not_zero_seconds() {
        let out = RunOutput {
            experiment: "x".into(),
            backend: "sim".into(),
            duration_s: 2.0,
            wall_time_s: 0.036,
            ..Default::default()
        };
        let t = out.summary_table();
        assert!(
            t.starts_with("x on sim: 2.0 s of traffic in 36 ms wall time"),
            "{t}"
        );
        assert_eq!(wall_time(10.14), "10.1 s");
    }

    #[test]
    fn summary_weights_means_by_received_and_sums_loss() {
        let out = RunOutput {
            flows: vec![
                rec("a", 100, 90, 1.0),
                rec("a", 100, 10, 11.0),
                rec("b", 50, 50, 2.0),
            ],
            ..Default::default()
        };
        let s = out.summary();
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].class, "a");
        assert!((s[0].avg_ms.unwrap() - 2.0).abs() < 1e-9);
        assert!((s[0].loss_pct - 50.0).abs() < 1e-9);
        assert_eq!(s[0].max_ms, Some(33.0));
        assert_eq!(s[1].loss_pct, 0.0);
        // Goodput adds up over the class's flows, and the table shows it in Mb/s.
        assert!((s[0].goodput_bps - 2e6).abs() < 1e-6);
        let table = out.summary_table();
        let head = table.lines().nth(1).expect("header");
        assert!(head.trim_end().ends_with("Mb/s"), "{table}");
        let row_a = table.lines().nth(2).expect("row a");
        assert!(row_a.trim_end().ends_with(" 2.000"), "{table}");
    }

    #[test]
    fn means_of_huge_finite_delays_are_finite() {
        // Σ a·r overflowed: the mean of two flows of 1e308 ms was inf.
        let mut out = RunOutput {
            flows: vec![rec("a", 2, 2, 1e308), rec("a", 3, 3, 1.5e308)],
            ..Default::default()
        };
        let avg = out.summary()[0].avg_ms.unwrap();
        assert!((avg / 1.3e308 - 1.0).abs() < 1e-9, "{avg}");
        let probe = |avg: f64| FlowRecord {
            kind: "echo".into(),
            class: "p".into(),
            ..rec("p", 2, 2, avg)
        };
        out.flows = vec![rec("a", 2, 2, 1.0), probe(1e308), probe(1.7e308)];
        let avg = out.summary_probed()[0].avg_ms.unwrap();
        assert!((avg / 1.35e308 - 1.0).abs() < 1e-9, "{avg}");
        let mut samples = [1.7e308, f64::MAX, 1.0];
        let (min, mean, _, max) = stats_ms(&mut samples).unwrap();
        assert_eq!((min, max), (1.0, f64::MAX));
        assert!(mean.is_finite() && mean > 1e308, "{mean}");
    }

    #[test]
    fn probed_summary_takes_delay_from_the_probes_of_the_class_cube_and_loss_from_its_traffic() {
        let mut gold = rec("video", 100, 80, 9.0);
        gold.cube = "Gold".into();
        let mut be = rec("bulk", 100, 100, 50.0);
        be.cube = "BE".into();
        let probe = |avg: f64, received: u64| FlowRecord {
            kind: "echo".into(),
            class: "probe Gold".into(),
            cube: "Gold".into(),
            ..rec("probe Gold", received, received, avg)
        };
        let out = RunOutput {
            flows: vec![gold, be, probe(1.0, 30), probe(3.0, 10)],
            ..Default::default()
        };
        assert!(out.has_probes());
        let s = out.summary_probed();
        // The probes' own class is not a row; bulk has no probe in BE.
        let classes: Vec<&str> = s.iter().map(|r| r.class.as_str()).collect();
        assert_eq!(classes, ["video", "bulk"]);
        assert!(
            (s[0].avg_ms.unwrap() - 1.5).abs() < 1e-9,
            "weighted by replies"
        );
        assert_eq!((s[0].min_ms, s[0].max_ms), (Some(0.5), Some(9.0)));
        assert!((s[0].loss_pct - 20.0).abs() < 1e-9, "the traffic's loss");
        assert_eq!(s[1].avg_ms, Some(50.0), "no probe: the traffic's delay");
        // A probe in another DIF is not this class's.
        let mut other = out.clone();
        for f in other.flows.iter_mut().filter(|f| f.kind == "echo") {
            f.dif = "elsewhere".into();
        }
        assert!(!other.has_probes());
    }

    #[test]
    fn csv_round_trips_every_file_schema() {
        let flows = vec![rec("a", 3, 2, 1.5)];
        let back: Vec<FlowRecord> = from_csv(&to_csv(&flows).unwrap()).unwrap();
        assert_eq!(back, flows);
        let g = vec![GoodputPoint {
            series: "s".into(),
            sdu_bytes: 1000,
            goodput_bps: 1e6,
        }];
        assert_eq!(from_csv::<GoodputPoint>(&to_csv(&g).unwrap()).unwrap(), g);
    }

    #[test]
    fn reservoir_keeps_at_most_cap_per_class() {
        let mut r = Reservoir::new(10, 1);
        for i in 0..1000 {
            r.offer("x", i as f64);
        }
        r.offer("y", 1.0);
        let s = r.into_samples();
        assert_eq!(s.iter().filter(|x| x.class == "x").count(), 10);
        assert_eq!(s.iter().filter(|x| x.class == "y").count(), 1);
        // Not just the first ten.
        assert!(s.iter().any(|x| x.delay_ms >= 10.0));
    }

    #[test]
    fn stats_gives_min_mean_p99_max() {
        let mut v: Vec<f64> = (1..=100).map(|x| x as f64).collect();
        let (mn, mean, p99, mx) = stats_ms(&mut v).unwrap();
        assert_eq!((mn, p99, mx), (1.0, 99.0, 100.0));
        assert!((mean - 50.5).abs() < 1e-9);
    }
}
