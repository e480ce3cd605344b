//! Finished runs beside the papers' figures: `rina-lab report`.
//!
//! A reference file (TOML, `examples/lab/reference/<experiment>.toml`)
//! holds the figures of the paper an experiment reproduces, typed in once
//! with their source: per variant and class, the minimum, mean and maximum
//! delay and the loss (seed 003's Table II); per urgency and cherish level,
//! the rate limits (seed 004's Table 3, cumulative from the highest
//! level), with the C/U cell of each cube; and the paper's statements the
//! runs are to be read against. [`markdown`] writes the comparison table
//! and [`level_rates`] measures the aggregate rate per level.

use crate::results::{ClassSummary, RunOutput};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use thiserror::Error;

/// What can go wrong reading a reference file.
#[derive(Debug, Error)]
pub enum ReportError {
    /// The file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The error.
        source: std::io::Error,
    },
    /// The file is not a valid reference file.
    #[error("{path}: {msg}")]
    Parse {
        /// The file.
        path: String,
        /// What is wrong.
        msg: String,
    },
    /// No paper's figures come with rina-lab for this experiment.
    #[error(
        "no reference for experiment `{experiment}`: rina-lab has the papers' figures of {known} \
         (examples/lab/reference/); give one with --reference FILE"
    )]
    NoReference {
        /// The experiment's name.
        experiment: String,
        /// The experiments that have one.
        known: String,
    },
}

/// The papers' figures that come with rina-lab, by experiment name: the
/// files of `examples/lab/reference/`, built in so that `rina-lab report`
/// finds them wherever the binary is.
pub const BUILT_IN: &[(&str, &str)] = &[
    (
        "home-isp",
        include_str!("../../../examples/lab/reference/home-isp.toml"),
    ),
    (
        "metro-37",
        include_str!("../../../examples/lab/reference/metro-37.toml"),
    ),
];

/// The highest urgency or cherish level a reference may name: levels are
/// bytes in the C/U matrix.
pub const MAX_LEVEL: usize = u8::MAX as usize;

/// The papers' figures for one experiment.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reference {
    /// Where the figures come from (paper, table, section).
    pub source: String,
    /// Per-class figures (delay in ms, loss in percent).
    #[serde(default)]
    pub class: Vec<RefClass>,
    /// The C/U cell of each cube name: `[urgency, cherish]`, each at most
    /// [`MAX_LEVEL`].
    #[serde(default)]
    pub cells: BTreeMap<String, [usize; 2]>,
    /// Rate limits, cumulative from the highest level.
    #[serde(default)]
    pub limit: Vec<RefLimit>,
    /// Statements of the paper the runs are read against.
    #[serde(default)]
    pub statement: Vec<String>,
}

/// One class's figures in the paper.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RefClass {
    /// The variant of the experiment the row belongs to.
    pub variant: String,
    /// The class (traffic profile name).
    pub class: String,
    /// Minimum delay, ms.
    pub min_ms: Option<f64>,
    /// Mean delay, ms.
    pub avg_ms: Option<f64>,
    /// Maximum delay, ms.
    pub max_ms: Option<f64>,
    /// Loss, percent.
    pub loss_pct: Option<f64>,
}

/// A rate limit on the levels `0..=level` of one dimension.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RefLimit {
    /// `urgency` or `cherish`.
    pub dimension: Dimension,
    /// Highest level index covered (0 is the most urgent / cherished), at
    /// most [`MAX_LEVEL`].
    pub level: usize,
    /// The limit on the aggregate of levels `0..=level`, bit/s.
    pub bps: f64,
}

/// A dimension of the C/U matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dimension {
    /// Urgency (delay).
    Urgency,
    /// Cherish (loss).
    Cherish,
}

impl Reference {
    /// The built-in reference of experiment `name` ([`BUILT_IN`]).
    pub fn built_in(name: &str) -> Result<Reference, ReportError> {
        let Some((_, text)) = BUILT_IN.iter().find(|(n, _)| *n == name) else {
            return Err(ReportError::NoReference {
                experiment: name.to_string(),
                known: BUILT_IN
                    .iter()
                    .map(|(n, _)| *n)
                    .collect::<Vec<_>>()
                    .join(" and "),
            });
        };
        Self::parse(text).map_err(|msg| ReportError::Parse {
            path: format!("examples/lab/reference/{name}.toml"),
            msg,
        })
    }

    /// Reads and checks a reference file.
    pub fn read(path: &std::path::Path) -> Result<Reference, ReportError> {
        let p = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ReportError::Io {
            path: p.clone(),
            source,
        })?;
        Self::parse(&text).map_err(|msg| ReportError::Parse { path: p, msg })
    }

    /// Parses reference text, and checks its levels.
    pub fn parse(text: &str) -> Result<Reference, String> {
        let r: Reference = toml::from_str(text).map_err(|e| e.message().to_string())?;
        r.check_levels()?;
        Ok(r)
    }

    /// Checks that every level (a cube's cell, a limit's `level`) is at
    /// most [`MAX_LEVEL`]: the report makes a table as long as the
    /// highest, and 4 000 000 000 took 32 GB (the run aborted).
    fn check_levels(&self) -> Result<(), String> {
        for (cube, cell) in &self.cells {
            for (dim, level) in ["urgency", "cherish"].iter().zip(cell) {
                if *level > MAX_LEVEL {
                    return Err(format!(
                        "`cells`: cube `{cube}`: {dim} level {level} is outside 0..={MAX_LEVEL} \
                         (urgency and cherish levels are bytes)"
                    ));
                }
            }
        }
        for (i, l) in self.limit.iter().enumerate() {
            if l.level > MAX_LEVEL {
                return Err(format!(
                    "`limit` {} ({:?}): `level` {} is outside 0..={MAX_LEVEL} \
                     (urgency and cherish levels are bytes)",
                    i + 1,
                    l.dimension,
                    l.level
                ));
            }
        }
        Ok(())
    }

    /// The paper's row for `class` in `variant`.
    pub fn row(&self, variant: Option<&str>, class: &str) -> Option<&RefClass> {
        self.class
            .iter()
            .find(|r| Some(r.variant.as_str()) == variant && r.class == class)
    }
}

/// Measured aggregate rate per level of `dim`, for the cubes `cells`
/// places (cubes it does not know are left out): received SDU bytes over
/// the time they were delivered in, the traffic period plus the largest
/// delay of the flows counted (what a limiter holds back arrives after the
/// sources stop). SDU bytes, not PDU bytes: a little under what the
/// limiter charges.
pub fn level_rates(
    run: &RunOutput,
    cells: &BTreeMap<String, [usize; 2]>,
    dim: Dimension,
) -> Vec<f64> {
    let k = match dim {
        Dimension::Urgency => 0,
        Dimension::Cherish => 1,
    };
    let n = cells.values().map(|c| c[k] + 1).max().unwrap_or(0);
    let counted: Vec<_> = run
        .flows
        .iter()
        .filter_map(|f| cells.get(&f.cube).map(|c| (f, c[k])))
        .collect();
    let drain_s = counted
        .iter()
        .filter_map(|(f, _)| f.delay_max_ms)
        .fold(0.0, f64::max)
        / 1e3;
    let secs = (run.duration_s + drain_s).max(1e-9);
    let mut v = vec![0.0; n];
    for (f, level) in counted {
        v[level] += f.received as f64 * f.sdu_bytes * 8.0 / secs;
    }
    v
}

fn opt(x: Option<f64>) -> String {
    match x {
        Some(v) if v >= 100.0 => format!("{v:.0}"),
        Some(v) if v >= 1.0 => format!("{v:.2}"),
        Some(v) => format!("{v:.3}"),
        None => "–".into(),
    }
}

/// The run's label in headings: `experiment [variant] on backend`.
fn label(run: &RunOutput) -> String {
    match &run.variant {
        Some(v) => format!("{} [{v}] on {}", run.experiment, run.backend),
        None => format!("{} on {}", run.experiment, run.backend),
    }
}

/// The per-class figures compared with the paper's: delays from the echo
/// probes in each class's cube when the run has them (seed 003's paper
/// measured so, [`RunOutput::summary_probed`]), else from the traffic.
fn compared(run: &RunOutput) -> Vec<ClassSummary> {
    if run.has_probes() {
        run.summary_probed()
    } else {
        run.summary()
    }
}

/// Per class: ours and the paper's min/avg/max delay and loss.
fn class_table(out: &mut String, run: &RunOutput, r: &Reference) {
    let probed = run.has_probes();
    let traffic = run.summary();
    if probed {
        let _ = writeln!(
            out,
            "Delays from echo probes in each class's QoS cube (RTT / 2, one \
             every 100 ms), as the paper measured them; loss and Mb/s from the \
             class's own traffic, whose own mean delay is the last column.\n"
        );
    }
    let _ = writeln!(
        out,
        "| class | min ms | paper | avg ms | paper | max ms | paper | loss % | paper | Mb/s |{}\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |{}",
        if probed { " traffic avg ms |" } else { "" },
        if probed { " ---: |" } else { "" }
    );
    for s in compared(run) {
        let p = r.row(run.variant.as_deref(), &s.class);
        let own = traffic
            .iter()
            .find(|t| t.class == s.class)
            .and_then(|t| t.avg_ms);
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {:.3} | {} | {:.2} |{}",
            s.class,
            opt(s.min_ms),
            opt(p.and_then(|p| p.min_ms)),
            opt(s.avg_ms),
            opt(p.and_then(|p| p.avg_ms)),
            opt(s.max_ms),
            opt(p.and_then(|p| p.max_ms)),
            s.loss_pct,
            opt(p.and_then(|p| p.loss_pct)),
            s.goodput_bps / 1e6,
            if probed {
                format!(" {} |", opt(own))
            } else {
                String::new()
            }
        );
    }
}

/// Per limit: the measured aggregate of the levels it covers.
fn limit_table(out: &mut String, run: &RunOutput, r: &Reference) {
    let _ = writeln!(
        out,
        "\n| dimension | levels | measured Mb/s | limit Mb/s | held |\n| --- | --- | ---: | ---: | --- |"
    );
    for l in &r.limit {
        let rates = level_rates(run, &r.cells, l.dimension);
        let sum: f64 = rates.iter().take(l.level + 1).sum();
        let _ = writeln!(
            out,
            "| {:?} | 0..={} | {:.2} | {:.2} | {} |",
            l.dimension,
            l.level,
            sum / 1e6,
            l.bps / 1e6,
            if sum <= l.bps { "yes" } else { "**no**" }
        );
    }
}

/// The comparison of `runs` with `reference`, as Markdown.
pub fn markdown(runs: &[RunOutput], reference: &Reference) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "Reference: {}\n", reference.source);
    for run in runs {
        let _ = writeln!(
            out,
            "## {}\n\n{:.1} s of traffic, {} wall time.\n",
            label(run),
            run.duration_s,
            crate::results::wall_time(run.wall_time_s)
        );
        class_table(&mut out, run, reference);
        if !reference.limit.is_empty() {
            limit_table(&mut out, run, reference);
        }
        out.push('\n');
    }
    if !reference.statement.is_empty() {
        let _ = writeln!(out, "## The paper's statements\n");
        for s in &reference.statement {
            let _ = writeln!(out, "- {s}");
        }
    }
    out
}

/// A labelled series of values per class (`None`: no figure).
pub type Series = (String, Vec<Option<f64>>);

/// Mean delay per class, ours and the paper's, for the plot: the classes,
/// then one series per run and one per run with paper figures.
pub fn delay_series(runs: &[RunOutput], reference: &Reference) -> (Vec<String>, Vec<Series>) {
    let mut classes: Vec<String> = Vec::new();
    for s in runs.iter().flat_map(compared) {
        if !classes.contains(&s.class) {
            classes.push(s.class);
        }
    }
    let mut series = Vec::new();
    for run in runs {
        let sum = compared(run);
        let tag = run
            .variant
            .clone()
            .unwrap_or_else(|| run.experiment.clone());
        let ours = classes
            .iter()
            .map(|c| sum.iter().find(|s| &s.class == c).and_then(|s| s.avg_ms))
            .collect();
        series.push((format!("{tag} ({})", run.backend), ours));
        let paper: Vec<Option<f64>> = classes
            .iter()
            .map(|c| {
                reference
                    .row(run.variant.as_deref(), c)
                    .and_then(|p| p.avg_ms)
            })
            .collect();
        if paper.iter().any(Option::is_some) {
            series.push((format!("{tag} (paper)"), paper));
        }
    }
    (classes, series)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_built_in_references_parse() {
        for (name, _) in BUILT_IN {
            let r = Reference::built_in(name).unwrap();
            assert!(!r.source.is_empty(), "{name}");
            assert!(!r.class.is_empty() || !r.limit.is_empty(), "{name}");
        }
        assert!(matches!(
            Reference::built_in("line-3"),
            Err(ReportError::NoReference { .. })
        ));
    }

    #[test]
    fn a_level_past_a_byte_is_refused_naming_the_cube_or_limit() {
        // Read as given before: the report then made a table as long as the
        // level (4e9: "memory allocation of 32000000008 bytes failed",
        // aborted; 2^63 - 1: "capacity overflow", a panic).
        let cells = |u: u64, c: u64| {
            format!("source = \"x\"\ncells = {{ best-effort = [0, 0], urgent = [{u}, {c}] }}\n")
        };
        let e = Reference::parse(&cells(4_000_000_000, 0)).unwrap_err();
        assert_eq!(
            e,
            "`cells`: cube `urgent`: urgency level 4000000000 is outside 0..=255 \
             (urgency and cherish levels are bytes)"
        );
        let e = Reference::parse(&cells(1, 256)).unwrap_err();
        assert!(
            e.starts_with("`cells`: cube `urgent`: cherish level 256 is outside 0..=255"),
            "{e}"
        );
        let ok = Reference::parse(&cells(255, 255)).unwrap();
        assert_eq!(ok.cells["urgent"], [255, 255]);
        let limit = |level: u64| {
            format!(
                "{}[[limit]]\ndimension = \"urgency\"\nlevel = 0\nbps = 1e6\n\
                 [[limit]]\ndimension = \"cherish\"\nlevel = {level}\nbps = 1e6\n",
                cells(0, 0)
            )
        };
        let e = Reference::parse(&limit(9_223_372_036_854_775_807)).unwrap_err();
        assert!(
            e.starts_with("`limit` 2 (Cherish): `level` 9223372036854775807 is outside 0..=255"),
            "{e}"
        );
        assert_eq!(Reference::parse(&limit(255)).unwrap().limit[1].level, 255);
        // Through read, the error names the file.
        let dir = std::env::temp_dir().join(format!("rina-lab-ref-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("ref.toml");
        std::fs::write(&path, cells(4_000_000_000, 0)).unwrap();
        let e = Reference::read(&path).unwrap_err().to_string();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(
            e.starts_with(&format!("{}: `cells`: cube `urgent`", path.display())),
            "{e}"
        );
    }
}
