//! Plots of a run, as PNG and SVG: delay CDFs per class (seed 003 Figs.
//! 4–5), goodput against SDU size per series (seed 000), RTT against hop
//! count (seed 000's link-state routing experiment), and comparisons across
//! runs (e.g. the variants of one experiment).
//!
//! Everything is drawn in pure Rust (plotters' bitmap and SVG backends,
//! glyphs by `ab_glyph` from the bundled DejaVu Sans, `assets/`): no system
//! font library is needed. A plot without data is skipped, not drawn empty.
//! Delays (samples, means, RTTs) that are negative, not finite or beyond
//! 1e12 ms are left out (means: negative ones are drawn).

use crate::results::{RunOutput, Sample};
use plotters::coord::Shift;
use plotters::prelude::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use thiserror::Error;

/// The bundled font (DejaVu Sans; licence in `assets/DejaVuSans-LICENSE.txt`).
static FONT: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");

/// Size of a single plot, pixels.
const SIZE: (u32, u32) = (1000, 640);

/// Most points drawn per CDF line (more samples are drawn as quantiles).
const MAX_CDF_POINTS: usize = 1000;

/// Series colours (Tableau 10).
const COLOURS: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

/// What can go wrong while plotting.
#[derive(Debug, Error)]
pub enum PlotError {
    /// The plots folder could not be created.
    #[error("{path}: {source}")]
    Io {
        /// The folder.
        path: String,
        /// The error.
        source: std::io::Error,
    },
    /// The bundled font could not be loaded.
    #[error("the bundled font cannot be loaded")]
    Font,
    /// Drawing or writing a figure failed.
    #[error("{path}: {what}")]
    Draw {
        /// The figure's file.
        path: String,
        /// What failed.
        what: String,
    },
}

fn colour(i: usize) -> RGBColor {
    COLOURS[i % COLOURS.len()]
}

/// Registers the bundled font once (plotters looks fonts up by family).
fn font() -> Result<(), PlotError> {
    static DONE: OnceLock<bool> = OnceLock::new();
    let ok = *DONE.get_or_init(|| {
        ["sans-serif", "serif", "monospace"].iter().all(|fam| {
            plotters::style::register_font(fam, FontStyle::Normal, FONT).is_ok()
                && plotters::style::register_font(fam, FontStyle::Bold, FONT).is_ok()
        })
    });
    if ok {
        Ok(())
    } else {
        Err(PlotError::Font)
    }
}

/// A figure that can be drawn on any plotters backend.
trait Figure {
    /// Pixel size.
    fn size(&self) -> (u32, u32) {
        SIZE
    }
    /// Draws onto `root` (already filled white).
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String>;
}

/// Writes `fig` as `<stem>.png` and `<stem>.svg` in `dir`.
fn render(fig: &impl Figure, dir: &Path, stem: &str) -> Result<Vec<PathBuf>, PlotError> {
    font()?;
    let png = dir.join(format!("{stem}.png"));
    let svg = dir.join(format!("{stem}.svg"));
    let fail = |p: &Path, what: String| PlotError::Draw {
        path: p.display().to_string(),
        what,
    };
    {
        let root = BitMapBackend::new(&png, fig.size()).into_drawing_area();
        root.fill(&WHITE).map_err(|e| fail(&png, e.to_string()))?;
        fig.draw(&root).map_err(|e| fail(&png, e))?;
        root.present().map_err(|e| fail(&png, e.to_string()))?;
    }
    {
        let root = SVGBackend::new(&svg, fig.size()).into_drawing_area();
        root.fill(&WHITE).map_err(|e| fail(&svg, e.to_string()))?;
        fig.draw(&root).map_err(|e| fail(&svg, e))?;
        root.present().map_err(|e| fail(&svg, e.to_string()))?;
    }
    Ok(vec![png, svg])
}

fn mkdir(dir: &Path) -> Result<(), PlotError> {
    std::fs::create_dir_all(dir).map_err(|e| PlotError::Io {
        path: dir.display().to_string(),
        source: e,
    })
}

/// Writes every plot `run` has data for into `dir` (created if needed):
/// `delay_cdf`, `goodput_sdu` and `rtt_hops`, each as `.png` and `.svg`.
/// Returns the files written (none if the run has nothing to plot).
pub fn plot_run(run: &RunOutput, dir: &Path) -> Result<Vec<PathBuf>, PlotError> {
    let title = run_label(run);
    let cdf = DelayCdf {
        title: format!("Delay CDF per class: {title}"),
        classes: classes_of(run),
    };
    let goodput = Goodput::of(run, &title);
    let rtt = RttHops::of(run, &title);
    let mut out = Vec::new();
    if cdf.classes.is_empty() && goodput.is_none() && rtt.is_none() {
        return Ok(out);
    }
    mkdir(dir)?;
    if !cdf.classes.is_empty() {
        out.extend(render(&cdf, dir, "delay_cdf")?);
    }
    if let Some(g) = goodput {
        out.extend(render(&g, dir, "goodput_sdu")?);
    }
    if let Some(r) = rtt {
        out.extend(render(&r, dir, "rtt_hops")?);
    }
    Ok(out)
}

/// Writes comparison plots of several runs into `dir`: `compare_delay`
/// (mean delay per class, a bar per run) and `compare_delay_cdf` (a panel
/// per class, a CDF line per run). Runs are named by their variant (or
/// experiment and backend). Returns the files written.
pub fn plot_compare(runs: &[RunOutput], dir: &Path) -> Result<Vec<PathBuf>, PlotError> {
    let labels = run_labels(runs);
    let bars = CompareBars::of(runs, &labels);
    let cdfs = CompareCdf::of(runs, &labels);
    let mut out = Vec::new();
    if bars.is_none() && cdfs.is_none() {
        return Ok(out);
    }
    mkdir(dir)?;
    if let Some(b) = bars {
        out.extend(render(&b, dir, "compare_delay")?);
    }
    if let Some(c) = cdfs {
        out.extend(render(&c, dir, "compare_delay_cdf")?);
    }
    Ok(out)
}

/// Writes `report_delay` into `dir`: mean delay per class, a bar per
/// series (a run or the paper's figures for it, [`crate::report::delay_series`]).
pub fn plot_reference(
    classes: &[String],
    series: &[(String, Vec<Option<f64>>)],
    dir: &Path,
) -> Result<Vec<PathBuf>, PlotError> {
    if classes.is_empty() || series.is_empty() {
        return Ok(Vec::new());
    }
    let bars = CompareBars::new(
        classes.to_vec(),
        series.iter().map(|(l, _)| l.clone()).collect(),
        (0..classes.len())
            .map(|i| {
                series
                    .iter()
                    .map(|(_, v)| v.get(i).copied().flatten())
                    .collect()
            })
            .collect(),
    );
    mkdir(dir)?;
    render(&bars, dir, "report_delay")
}

/// `experiment [variant] (backend)`.
fn run_label(run: &RunOutput) -> String {
    match &run.variant {
        Some(v) => format!("{} [{}] ({})", run.experiment, v, run.backend),
        None => format!("{} ({})", run.experiment, run.backend),
    }
}

/// Short, distinct names for runs.
fn run_labels(runs: &[RunOutput]) -> Vec<String> {
    let base: Vec<String> = runs
        .iter()
        .map(|r| match &r.variant {
            Some(v) => v.clone(),
            None => format!("{} ({})", r.experiment, r.backend),
        })
        .collect();
    base.iter()
        .enumerate()
        .map(|(i, b)| {
            if base.iter().filter(|x| *x == b).count() > 1 {
                format!("{b} #{}", i + 1)
            } else {
                b.clone()
            }
        })
        .collect()
}

/// Classes with their delay samples, sorted ascending; classes in the order
/// the flows list them, then any others in the order of the samples.
fn classes_of(run: &RunOutput) -> Vec<(String, Vec<f64>)> {
    let mut by: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let mut order: Vec<&str> = Vec::new();
    for f in &run.flows {
        if !order.contains(&f.class.as_str()) {
            order.push(&f.class);
        }
    }
    for Sample { class, delay_ms } in &run.samples {
        if drawn(*delay_ms) {
            by.entry(class).or_default().push(*delay_ms);
            if !order.contains(&class.as_str()) {
                order.push(class);
            }
        }
    }
    order
        .into_iter()
        .filter_map(|c| {
            let mut v = by.remove(c)?;
            v.sort_by(|a, b| a.total_cmp(b));
            Some((c.to_string(), v))
        })
        .collect()
}

/// Mean delays differing by more than this factor are drawn on a log axis.
const LOG_BARS_RATIO: f64 = 30.0;

/// Smallest delay drawn on a log axis, ms (zero delays are drawn here).
const MIN_LOG_MS: f64 = 1e-3;

/// Largest delay drawn, ms (about 31 years): a larger one is no
/// measurement, and an axis made to hold it could end past the largest
/// f64 (plotters then draws no end of ticks, or an overflow panics).
const MAX_DELAY_MS: f64 = 1e12;

/// Most labels asked of an axis.
const MAX_LABELS: usize = 40;

/// Whether a delay sample or RTT, ms, is drawn.
fn drawn(d: f64) -> bool {
    (0.0..=MAX_DELAY_MS).contains(&d)
}

/// A mean delay, ms, if it is drawn (negative means, of one-way delays
/// between unsynchronised clocks, are kept as before).
fn drawn_mean(m: Option<f64>) -> Option<f64> {
    m.filter(|m| m.abs() <= MAX_DELAY_MS)
}

/// Points of the empirical CDF of sorted `v` (a step function, or
/// quantiles if there are many samples).
fn cdf_points(v: &[f64]) -> Vec<(f64, f64)> {
    let n = v.len();
    let x = |d: f64| d.max(MIN_LOG_MS);
    if n == 0 {
        return Vec::new();
    }
    if n <= MAX_CDF_POINTS {
        let mut p = Vec::with_capacity(2 * n);
        for (i, &d) in v.iter().enumerate() {
            p.push((x(d), i as f64 / n as f64));
            p.push((x(d), (i + 1) as f64 / n as f64));
        }
        p
    } else {
        (0..=MAX_CDF_POINTS)
            .map(|k| {
                let q = k as f64 / MAX_CDF_POINTS as f64;
                let i = ((q * n as f64).ceil() as usize).clamp(1, n) - 1;
                (x(v[i]), q)
            })
            .collect()
    }
}

/// Range of a log axis covering every sample of every line.
fn log_range<'a>(lines: impl Iterator<Item = &'a [f64]>) -> Option<(f64, f64)> {
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for v in lines {
        if let (Some(a), Some(b)) = (v.first(), v.last()) {
            lo = lo.min(a.clamp(MIN_LOG_MS, MAX_DELAY_MS));
            hi = hi.max(b.clamp(MIN_LOG_MS, MAX_DELAY_MS));
        }
    }
    if lo.is_finite() && hi.is_finite() {
        Some((lo / 1.25, hi * 1.25))
    } else {
        None
    }
}

/// A number for an axis label, without trailing noise.
fn num(v: f64) -> String {
    let a = v.abs();
    if a == 0.0 {
        "0".into()
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 1.0 {
        trim(format!("{v:.2}"))
    } else if a >= 0.001 {
        trim(format!("{v:.4}"))
    } else {
        format!("{v:.0e}")
    }
}

fn trim(s: String) -> String {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// Draws CDF lines (one per `(label, sorted samples)`) in `area`.
fn draw_cdf_lines<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    caption: &str,
    caption_size: u32,
    lines: &[(String, &[f64], RGBColor)],
    range: (f64, f64),
) -> Result<(), String> {
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", caption_size))
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(55)
        .build_cartesian_2d((range.0..range.1).log_scale(), 0.0..1.0)
        .map_err(e)?;
    chart
        .configure_mesh()
        .label_style(("sans-serif", 14))
        .axis_desc_style(("sans-serif", 16))
        .x_desc("delay, ms (log scale)")
        .y_desc("fraction of SDUs")
        .x_label_formatter(&|v| num(*v))
        .y_label_formatter(&|v| num(*v))
        .draw()
        .map_err(e)?;
    for (label, v, c) in lines {
        let c = *c;
        chart
            .draw_series(LineSeries::new(cdf_points(v), c.stroke_width(2)))
            .map_err(e)?
            .label(format!("{label} (n={})", v.len()))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(3)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 15))
        .draw()
        .map_err(e)?;
    Ok(())
}

/// Delay CDF per class of one run.
struct DelayCdf {
    title: String,
    classes: Vec<(String, Vec<f64>)>,
}

impl Figure for DelayCdf {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String> {
        let lines: Vec<(String, &[f64], RGBColor)> = self
            .classes
            .iter()
            .enumerate()
            .map(|(i, (c, v))| (c.clone(), v.as_slice(), colour(i)))
            .collect();
        let range = log_range(lines.iter().map(|l| l.1)).ok_or("no samples")?;
        draw_cdf_lines(root, &self.title, 22, &lines, range)
    }
}

/// Goodput against SDU size, a line per series.
struct Goodput {
    title: String,
    /// (series, [(sdu bytes, Mb/s)] sorted by size).
    series: Vec<(String, Vec<(f64, f64)>)>,
}

impl Goodput {
    fn of(run: &RunOutput, title: &str) -> Option<Goodput> {
        let mut series: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
        for g in &run.goodput {
            if !g.goodput_bps.is_finite() {
                continue;
            }
            let p = (g.sdu_bytes as f64, g.goodput_bps / 1e6);
            match series.iter_mut().find(|(s, _)| *s == g.series) {
                Some((_, v)) => v.push(p),
                None => series.push((g.series.clone(), vec![p])),
            }
        }
        if series.is_empty() {
            return None;
        }
        for (_, v) in &mut series {
            v.sort_by(|a, b| a.0.total_cmp(&b.0));
        }
        Some(Goodput {
            title: format!("Goodput against SDU size: {title}"),
            series,
        })
    }
}

impl Figure for Goodput {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String> {
        let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
        let all = self.series.iter().flat_map(|(_, v)| v.iter());
        let xmax = all.clone().map(|p| p.0).fold(1.0, f64::max);
        let ymax = all.map(|p| p.1).fold(0.0, f64::max).max(1e-3);
        let mut chart = ChartBuilder::on(root)
            .caption(&self.title, ("sans-serif", 22))
            .margin(12)
            .x_label_area_size(45)
            .y_label_area_size(65)
            .build_cartesian_2d(0.0..xmax * 1.05, 0.0..ymax * 1.1)
            .map_err(e)?;
        chart
            .configure_mesh()
            .label_style(("sans-serif", 14))
            .axis_desc_style(("sans-serif", 16))
            .x_desc("SDU size, bytes")
            .y_desc("goodput, Mb/s")
            .x_label_formatter(&|v| num(*v))
            .y_label_formatter(&|v| num(*v))
            .draw()
            .map_err(e)?;
        for (i, (name, v)) in self.series.iter().enumerate() {
            let c = colour(i);
            chart
                .draw_series(LineSeries::new(v.iter().copied(), c.stroke_width(2)))
                .map_err(e)?
                .label(name.as_str())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(3))
                });
            chart
                .draw_series(v.iter().map(|&p| Circle::new(p, 4, c.filled())))
                .map_err(e)?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font(("sans-serif", 15))
            .draw()
            .map_err(e)?;
        Ok(())
    }
}

/// RTT of every echo flow against its hop count, and the mean per hop.
struct RttHops {
    title: String,
    points: Vec<(u32, f64)>,
    means: Vec<(u32, f64)>,
}

impl RttHops {
    fn of(run: &RunOutput, title: &str) -> Option<RttHops> {
        let points: Vec<(u32, f64)> = run
            .flows
            .iter()
            .filter(|f| f.kind == "echo")
            .filter_map(|f| Some((f.hops?, f.rtt_avg_ms?)))
            .filter(|p| drawn(p.1))
            .collect();
        if points.is_empty() {
            return None;
        }
        let mut by: BTreeMap<u32, (f64, usize)> = BTreeMap::new();
        for &(h, r) in &points {
            let m = by.entry(h).or_default();
            m.0 += r;
            m.1 += 1;
        }
        let means = by
            .into_iter()
            .map(|(h, (s, n))| (h, s / n as f64))
            .collect();
        Some(RttHops {
            title: format!("RTT against hop count: {title}"),
            points,
            means,
        })
    }
}

impl Figure for RttHops {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String> {
        let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
        let hmax = self.points.iter().map(|p| p.0).max().unwrap_or(1).max(1);
        let ymax = self
            .points
            .iter()
            .map(|p| p.1)
            .fold(0.0, f64::max)
            .max(1e-3);
        let mut chart = ChartBuilder::on(root)
            .caption(&self.title, ("sans-serif", 22))
            .margin(12)
            .x_label_area_size(45)
            .y_label_area_size(65)
            .build_cartesian_2d(-0.5..hmax as f64 + 0.5, 0.0..ymax * 1.1)
            .map_err(e)?;
        chart
            .configure_mesh()
            .label_style(("sans-serif", 14))
            .axis_desc_style(("sans-serif", 16))
            .x_desc("hops")
            .y_desc("RTT, ms")
            .x_labels((hmax as usize).saturating_add(2).min(MAX_LABELS))
            .x_label_formatter(&|v| {
                if (v - v.round()).abs() < 1e-6 && *v >= 0.0 {
                    format!("{}", v.round() as i64)
                } else {
                    String::new()
                }
            })
            .y_label_formatter(&|v| num(*v))
            .draw()
            .map_err(e)?;
        let pc = colour(0);
        chart
            .draw_series(
                self.points
                    .iter()
                    .map(|&(h, r)| Circle::new((h as f64, r), 4, pc.mix(0.6).filled())),
            )
            .map_err(e)?
            .label("echo flow (mean RTT)")
            .legend(move |(x, y)| Circle::new((x + 10, y), 4, pc.filled()));
        let mc = colour(3);
        chart
            .draw_series(LineSeries::new(
                self.means.iter().map(|&(h, r)| (h as f64, r)),
                mc.stroke_width(2),
            ))
            .map_err(e)?
            .label("mean per hop count")
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], mc.stroke_width(3)));
        chart
            .draw_series(
                self.means
                    .iter()
                    .map(|&(h, r)| Cross::new((h as f64, r), 7, mc.stroke_width(2))),
            )
            .map_err(e)?;
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font(("sans-serif", 15))
            .draw()
            .map_err(e)?;
        Ok(())
    }
}

/// Mean delay per class, a bar per run.
struct CompareBars {
    classes: Vec<String>,
    runs: Vec<String>,
    /// [class][run] mean delay, ms.
    means: Vec<Vec<Option<f64>>>,
}

impl CompareBars {
    fn of(runs: &[RunOutput], labels: &[String]) -> Option<CompareBars> {
        let sums: Vec<_> = runs.iter().map(|r| r.summary()).collect();
        let mut classes: Vec<String> = Vec::new();
        for s in sums.iter().flatten() {
            if drawn_mean(s.avg_ms).is_some() && !classes.contains(&s.class) {
                classes.push(s.class.clone());
            }
        }
        if classes.is_empty() {
            return None;
        }
        let means = classes
            .iter()
            .map(|c| {
                sums.iter()
                    .map(|s| s.iter().find(|x| &x.class == c).and_then(|x| x.avg_ms))
                    .collect()
            })
            .collect();
        Some(CompareBars::new(classes, labels.to_vec(), means))
    }

    /// The bars of `means` ([class][run]): a mean that is not finite or is
    /// beyond [`MAX_DELAY_MS`] has none.
    fn new(classes: Vec<String>, runs: Vec<String>, means: Vec<Vec<Option<f64>>>) -> CompareBars {
        let means = means
            .into_iter()
            .map(|m| m.into_iter().map(drawn_mean).collect())
            .collect();
        CompareBars {
            classes,
            runs,
            means,
        }
    }
}

impl Figure for CompareBars {
    fn size(&self) -> (u32, u32) {
        let w = (self.classes.len() * self.runs.len() * 40 + 300).clamp(SIZE.0 as usize, 2400);
        (w as u32, SIZE.1)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String> {
        let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
        let n = self.classes.len();
        let vals = || self.means.iter().flatten().flatten().copied();
        let ymax = vals().fold(0.0, f64::max).max(1e-3);
        let ymin = vals().filter(|v| *v > 0.0).fold(ymax, f64::min);
        // Means that differ by orders of magnitude (Gold vs BE under
        // load) are drawn on a log axis, bars in log10 space.
        let log = ymax / ymin > LOG_BARS_RATIO;
        let (floor, top) = if log {
            (
                (ymin / 2.0).max(MIN_LOG_MS).log10().floor(),
                (ymax * 2.0).log10(),
            )
        } else {
            (0.0, ymax * 1.15)
        };
        let to_y = |v: f64| if log { v.max(MIN_LOG_MS).log10() } else { v };
        let mut chart = ChartBuilder::on(root)
            .caption("Mean delay per class", ("sans-serif", 22))
            .margin(12)
            .x_label_area_size(45)
            .y_label_area_size(65)
            .build_cartesian_2d(-0.5..n as f64 - 0.5, floor..top)
            .map_err(e)?;
        let classes = &self.classes;
        chart
            .configure_mesh()
            .label_style(("sans-serif", 14))
            .axis_desc_style(("sans-serif", 16))
            .disable_x_mesh()
            .x_labels(n + 1)
            .x_label_formatter(&|v| {
                let i = v.round();
                if (v - i).abs() < 1e-6 && i >= 0.0 {
                    classes.get(i as usize).cloned().unwrap_or_default()
                } else {
                    String::new()
                }
            })
            .y_desc(if log {
                "mean delay, ms (log scale)"
            } else {
                "mean delay, ms"
            })
            .y_labels(if log {
                ((top - floor) as usize).saturating_add(2).min(MAX_LABELS)
            } else {
                10
            })
            .y_label_formatter(&|v| {
                if !log {
                    num(*v)
                } else if (v - v.round()).abs() < 1e-6 {
                    num(10f64.powf(v.round()))
                } else {
                    String::new()
                }
            })
            .draw()
            .map_err(e)?;
        let k = self.runs.len().max(1);
        let w = 0.8 / k as f64;
        for (j, run) in self.runs.iter().enumerate() {
            let c = colour(j);
            let bars = self.means.iter().enumerate().filter_map(|(i, m)| {
                let y = m.get(j).copied().flatten()?;
                let x0 = i as f64 - 0.4 + j as f64 * w;
                Some(Rectangle::new(
                    [(x0, floor), (x0 + w * 0.95, to_y(y))],
                    c.filled(),
                ))
            });
            chart
                .draw_series(bars)
                .map_err(e)?
                .label(run.as_str())
                .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 16, y + 6)], c.filled()));
            // The value above each bar.
            let texts = self.means.iter().enumerate().filter_map(|(i, m)| {
                let y = m.get(j).copied().flatten()?;
                let x = i as f64 - 0.4 + (j as f64 + 0.1) * w;
                Some(
                    EmptyElement::at((x, to_y(y)))
                        + Text::new(num(y), (0, -14), ("sans-serif", 12)),
                )
            });
            chart.draw_series(texts).map_err(e)?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font(("sans-serif", 15))
            .draw()
            .map_err(e)?;
        Ok(())
    }
}

/// Delay CDFs side by side: a panel per class, a line per run.
struct CompareCdf {
    runs: Vec<String>,
    /// (class, per run: sorted samples).
    panels: Vec<(String, Vec<Vec<f64>>)>,
}

impl CompareCdf {
    fn of(runs: &[RunOutput], labels: &[String]) -> Option<CompareCdf> {
        let per_run: Vec<Vec<(String, Vec<f64>)>> = runs.iter().map(classes_of).collect();
        let mut classes: Vec<String> = Vec::new();
        for (c, _) in per_run.iter().flatten() {
            if !classes.contains(c) {
                classes.push(c.clone());
            }
        }
        if classes.is_empty() {
            return None;
        }
        let panels = classes
            .into_iter()
            .map(|c| {
                let v = per_run
                    .iter()
                    .map(|r| {
                        r.iter()
                            .find(|(x, _)| *x == c)
                            .map(|(_, v)| v.clone())
                            .unwrap_or_default()
                    })
                    .collect();
                (c, v)
            })
            .collect();
        Some(CompareCdf {
            runs: labels.to_vec(),
            panels,
        })
    }

    fn grid(&self) -> (usize, usize) {
        let n = self.panels.len();
        let cols = n.clamp(1, 3);
        (n.div_ceil(cols), cols)
    }
}

impl Figure for CompareCdf {
    fn size(&self) -> (u32, u32) {
        let (rows, cols) = self.grid();
        (cols as u32 * 560, rows as u32 * 420 + 50)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String> {
        let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
        let root = root
            .titled("Delay CDF per class and run", ("sans-serif", 24))
            .map_err(e)?;
        let areas = root.split_evenly(self.grid());
        for ((class, per_run), area) in self.panels.iter().zip(areas.iter()) {
            let lines: Vec<(String, &[f64], RGBColor)> = per_run
                .iter()
                .enumerate()
                .filter(|(_, v)| !v.is_empty())
                .map(|(j, v)| (self.runs[j].clone(), v.as_slice(), colour(j)))
                .collect();
            let Some(range) = log_range(lines.iter().map(|l| l.1)) else {
                continue;
            };
            draw_cdf_lines(area, class, 18, &lines, range)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cdf_is_a_step_function_ending_at_one() {
        let p = cdf_points(&[1.0, 2.0, 4.0]);
        assert_eq!(p.first(), Some(&(1.0, 0.0)));
        assert_eq!(p.last(), Some(&(4.0, 1.0)));
        assert!(p.windows(2).all(|w| w[0].0 <= w[1].0 && w[0].1 <= w[1].1));
    }

    #[test]
    fn many_samples_are_drawn_as_quantiles() {
        let v: Vec<f64> = (0..100_000).map(|x| x as f64).collect();
        let p = cdf_points(&v);
        assert_eq!(p.len(), MAX_CDF_POINTS + 1);
        assert_eq!(p.last().unwrap().0, 99_999.0);
        // Zero is drawn at the log axis' floor.
        assert_eq!(p[0].0, MIN_LOG_MS);
    }

    #[test]
    fn duplicate_run_labels_are_numbered() {
        let r = RunOutput {
            experiment: "x".into(),
            backend: "sim".into(),
            ..Default::default()
        };
        let l = run_labels(&[r.clone(), r]);
        assert_eq!(l, ["x (sim) #1", "x (sim) #2"]);
    }
}
