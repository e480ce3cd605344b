//! `rina-lab`: check, run, plot and show whole RINA experiments.
//!
//! ```text
//! rina-lab check FILE [--variant NAME]...
//! rina-lab run FILE [--backend local|netns|sim|ssh] [--inventory FILE]
//!                   [--variant NAME]... [--duration D] [--out DIR] [--no-plots] [--json]
//! rina-lab plot RUN_DIR... [--out DIR]
//! rina-lab show RUN_DIR... [--json]
//! ```
//!
//! Exit codes: 0 done; 1 a run, a backend or a file operation failed; 2 the
//! command line or the experiment file is wrong (the message names the
//! line); 130 interrupted (Ctrl-C; a second Ctrl-C exits at once).

use clap::{Args, Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use rina_lab::backend::{self, RunCtx};
use rina_lab::model::TrafficKind;
use rina_lab::plot::{plot_compare, plot_run};
use rina_lab::resolve::{self, EventKind, Lower, Over};
use rina_lab::results::RunOutput;
use rina_lab::{Experiment, LabError};
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// `println!` that ignores a closed stdout (e.g. piped into `head`).
macro_rules! say {
    () => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout().lock());
    }};
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout().lock(), $($t)*);
    }};
}

/// `print!` that ignores a closed stdout.
macro_rules! say_raw {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = write!(std::io::stdout().lock(), $($t)*);
    }};
}

/// Exit code: a run or a file operation failed.
const EXIT_FAILED: u8 = 1;
/// Exit code: the command line or the experiment file is wrong.
const EXIT_USAGE: u8 = 2;
/// Exit code: interrupted.
const EXIT_INTERRUPTED: u8 = 130;

#[derive(Parser)]
#[command(
    name = "rina-lab",
    version,
    about = "Describe, run, measure and plot whole RINA experiments"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Check an experiment file and print what is derived from it (DIFs
    /// bottom-up, bootstrap members, enrollment order, flows per class).
    Check {
        /// The experiment file (TOML).
        file: PathBuf,
        /// Check and print this variant (repeatable; default: the base
        /// experiment in full, every variant checked).
        #[arg(long = "variant", value_name = "NAME")]
        variants: Vec<String>,
    },
    /// Run an experiment and write its results, summary and plots.
    Run(RunArgs),
    /// Draw the plots of finished runs again from their `run.json`; with
    /// several runs, also the comparison plots.
    Plot {
        /// Run folders (a folder holding one folder per variant counts as
        /// its variants).
        #[arg(required = true, value_name = "RUN_DIR")]
        dirs: Vec<PathBuf>,
        /// Where the comparison plots go (default: `plots/` of the one
        /// folder given, else `compare-plots/` in the folders' common parent).
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
    },
    /// Compare finished runs with the paper they reproduce: writes
    /// `report.md` (per class ours beside the paper's min/avg/max delay and
    /// loss, rate limits measured against the paper's, its statements) and
    /// the plot `report_delay` into the first folder given (or --out).
    Report {
        /// Run folders (a folder holding one folder per variant counts as
        /// its variants).
        #[arg(required = true, value_name = "RUN_DIR")]
        dirs: Vec<PathBuf>,
        /// The reference file (default: the papers' figures built into
        /// rina-lab, examples/lab/reference/<experiment>.toml: metro-37 and
        /// home-isp).
        #[arg(long, value_name = "FILE")]
        reference: Option<PathBuf>,
        /// Where report.md and the plot go.
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
        /// The runs were made with `run --scale F`: the reference's rate
        /// limits are multiplied by F.
        #[arg(long, value_name = "F", default_value_t = 1.0)]
        scale: f64,
    },
    /// Print the summary of finished runs.
    Show {
        /// Run folders.
        #[arg(required = true, value_name = "RUN_DIR")]
        dirs: Vec<PathBuf>,
        /// Print the per-class figures as JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Args)]
struct RunArgs {
    /// The experiment file (TOML).
    file: PathBuf,
    /// Where to run: `local` (processes on loopback, no root), `netns`
    /// (namespaces and veth pairs, root), `sim` (the simulator) or `ssh`
    /// (hosts of a testbed, with --inventory).
    #[arg(long, default_value = "local", value_name = "NAME")]
    backend: String,
    /// `ssh` only: the inventory file (hosts, which nodes each runs, how
    /// links are made; see docs/rina-lab.md).
    #[arg(long, value_name = "FILE")]
    inventory: Option<PathBuf>,
    /// Run this variant (repeatable; default: every variant of the file, or
    /// the base experiment if it has none).
    #[arg(long = "variant", value_name = "NAME")]
    variants: Vec<String>,
    /// Shorten (or lengthen) the experiment to this duration (e.g. `5s`,
    /// `600s`); traffic and event times are scaled.
    #[arg(long, value_name = "D", value_parser = parse_duration)]
    duration: Option<Duration>,
    /// Multiply every link rate and every tgen source's rate by F (e.g.
    /// 0.05: seed 003 at 1/20 of the paper's rates, the same load);
    /// F from 0.001 to 1000.
    #[arg(long, value_name = "F")]
    scale: Option<f64>,
    /// Dilate time by 1/F (e.g. 0.05: twenty times slower): rates times F
    /// as --scale does, and every time of the traffic (ON-OFF periods, link
    /// delays, flow and event times, the run's length after --duration)
    /// divided by F, so queueing delays are the original's over F and their
    /// ratios are kept. Results show the run's own times; `report` divides
    /// them back. F from 0.01 (a hundred times slower) to 1.
    #[arg(long, value_name = "F", conflicts_with = "scale")]
    dilate: Option<f64>,
    /// Results folder (default: results/<experiment>/<UTC time>-<backend>).
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Do not draw plots.
    #[arg(long)]
    no_plots: bool,
    /// Print the outcome as JSON on stdout instead of tables.
    #[arg(long)]
    json: bool,
    /// `sim` only: the engine, `protocol` (a rina-core System per node:
    /// every layer, every queue) or `queueing` (a PDU-level approximation);
    /// default: the protocol engine when it can run the experiment.
    #[arg(long, value_name = "NAME")]
    engine: Option<String>,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let d = rina_lab::units::parse_duration(s)?.get();
    if d.is_zero() {
        return Err("the duration must be above 0".into());
    }
    Ok(d)
}

/// A command that failed: its message and exit code.
#[derive(Debug)]
struct Fail {
    code: u8,
    msg: String,
}

impl Fail {
    fn usage(msg: impl Into<String>) -> Fail {
        Fail {
            code: EXIT_USAGE,
            msg: msg.into(),
        }
    }

    fn failed(msg: impl Into<String>) -> Fail {
        Fail {
            code: EXIT_FAILED,
            msg: msg.into(),
        }
    }
}

impl From<LabError> for Fail {
    fn from(e: LabError) -> Fail {
        let code = match e {
            LabError::At { .. } | LabError::NoVariant { .. } => EXIT_USAGE,
            LabError::Interrupted => EXIT_INTERRUPTED,
            _ => EXIT_FAILED,
        };
        Fail {
            code,
            msg: e.to_string(),
        }
    }
}

fn main() -> ExitCode {
    rina_docgen::handle::<Cli>();
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Check { file, variants } => cmd_check(&file, &variants),
        Cmd::Run(a) => cmd_run(a),
        Cmd::Plot { dirs, out } => cmd_plot(&dirs, out),
        Cmd::Show { dirs, json } => cmd_show(&dirs, json),
        Cmd::Report {
            dirs,
            reference,
            out,
            scale,
        } => cmd_report(&dirs, reference, out, scale),
    };
    match r {
        Ok(code) => ExitCode::from(code),
        Err(f) => {
            eprintln!("rina-lab: {}", f.msg);
            ExitCode::from(f.code)
        }
    }
}

fn read_file(path: &Path) -> Result<String, Fail> {
    std::fs::read_to_string(path).map_err(|e| Fail::failed(format!("{}: {e}", path.display())))
}

/// Loads the file and resolves the variants asked for (all of them if
/// none is named, or the base experiment if the file has none).
fn resolve_all(path: &Path, text: &str, asked: &[String]) -> Result<Vec<Experiment>, Fail> {
    let at = |e: LabError| {
        let mut f = Fail::from(e);
        f.msg = format!("{}: {}", path.display(), f.msg);
        f
    };
    let file = resolve::parse(text).map_err(at)?;
    let names: Vec<Option<String>> = if asked.is_empty() {
        let all = resolve::variant_names(&file);
        if all.is_empty() {
            vec![None]
        } else {
            all.into_iter().map(Some).collect()
        }
    } else {
        asked.iter().cloned().map(Some).collect()
    };
    names
        .iter()
        .map(|v| resolve::resolve(text, &file, v.as_deref()).map_err(at))
        .collect()
}

// ---------------------------------------------------------------- check

fn cmd_check(path: &Path, asked: &[String]) -> Result<u8, Fail> {
    let text = read_file(path)?;
    // The base experiment is always checked; the variants too.
    let file = resolve::parse(&text).map_err(|e| Fail {
        msg: format!("{}: {}", path.display(), e),
        ..Fail::from(e)
    })?;
    let base = resolve::resolve(&text, &file, None).map_err(|e| Fail {
        msg: format!("{}: {}", path.display(), e),
        ..Fail::from(e)
    })?;
    let all = resolve::variant_names(&file);
    let vars = resolve_all(path, &text, if asked.is_empty() { &all } else { asked })?;
    if asked.is_empty() {
        say_raw!("{}", describe(&base));
        if !all.is_empty() {
            say!("variants:");
            for v in vars.iter().filter(|v| v.variant.is_some()) {
                say!(
                    "  {}: ok ({} flows, {} DIFs)",
                    v.variant.as_deref().unwrap_or(""),
                    v.flows.len(),
                    v.difs.len()
                );
            }
        }
    } else {
        for v in &vars {
            say_raw!("{}", describe(v));
        }
    }
    say!("{}: ok", path.display());
    Ok(0)
}

fn rate(bps: f64) -> String {
    if bps >= resolve::UNLIMITED_BPS {
        "unlimited".into()
    } else if bps >= 1e9 {
        format!("{} Gb/s", short(bps / 1e9))
    } else if bps >= 1e6 {
        format!("{} Mb/s", short(bps / 1e6))
    } else if bps >= 1e3 {
        format!("{} kb/s", short(bps / 1e3))
    } else {
        format!("{} b/s", short(bps))
    }
}

fn dur(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s == 0.0 {
        "0".into()
    } else if s >= 1.0 {
        format!("{} s", short(s))
    } else if s >= 1e-3 {
        format!("{} ms", short(s * 1e3))
    } else {
        format!("{} us", short(s * 1e6))
    }
}

/// A number with at most three decimals, without trailing zeros.
fn short(x: f64) -> String {
    let s = format!("{x:.3}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    s.to_string()
}

/// What `check` prints: everything derived from the file.
fn describe(e: &Experiment) -> String {
    let mut s = String::new();
    describe_head(&mut s, e);
    describe_links(&mut s, e);
    let _ = writeln!(s, "DIFs, bottom-up ({}):", e.difs.len());
    for d in &e.difs {
        describe_dif(&mut s, e, d);
    }
    describe_apps(&mut s, e);
    describe_flows(&mut s, e);
    describe_events(&mut s, e);
    if let Some(l) = &e.load {
        let _ = writeln!(
            s,
            "load calibration: {}% on {} link(s), measured over {}",
            short(l.target * 100.0),
            l.links.len(),
            dur(l.duration)
        );
    }
    // What `--backend sim` would run it on, and why.
    if let Ok((_, why)) = rina_lab::backend::sim::Engine::choose(e, None) {
        let _ = writeln!(s, "on --backend sim, {why}");
    }
    s
}

/// The experiment's title, duration, seed, warm-up and nodes.
fn describe_head(s: &mut String, e: &Experiment) {
    let title = match &e.variant {
        Some(v) => format!("{} [variant {v}]", e.name),
        None => e.name.clone(),
    };
    let _ = writeln!(s, "experiment {title}: {}", e.description);
    let _ = writeln!(
        s,
        "  duration {}, seed {}, warm-up {}",
        dur(e.duration),
        e.seed,
        e.warmup.map_or("backend default".into(), dur)
    );
    let _ = writeln!(s, "nodes ({}): {}", e.nodes.len(), e.nodes.join(", "));
}

/// The links, one a line.
fn describe_links(s: &mut String, e: &Experiment) {
    let _ = writeln!(s, "links ({}):", e.links.len());
    for l in &e.links {
        let _ = writeln!(
            s,
            "  {}: {} - {}, {}, delay {}, loss {}, queue {} frames",
            l.name,
            node_name(e, l.a),
            node_name(e, l.b),
            rate(l.rate_bps),
            dur(l.delay),
            l.loss,
            l.queue
        );
    }
}

/// One DIF: what it is over, members, adjacencies, enrollment, scheduler, cubes.
fn describe_dif(s: &mut String, e: &Experiment, d: &resolve::Dif) {
    let node = |i: usize| node_name(e, i);
    let names = |v: &[usize]| v.iter().map(|&i| node(i)).collect::<Vec<_>>().join(", ");
    let over: Vec<String> = d
        .over
        .iter()
        .map(|o| match o {
            Lower::Links => "links".to_string(),
            Lower::Dif(i) => e.difs.get(*i).map_or("?".into(), |x| x.name.clone()),
        })
        .collect();
    let _ = writeln!(s, "  {} over {}", d.name, over.join(", "));
    let _ = writeln!(
        s,
        "    members ({}): {}",
        d.members.len(),
        names(&d.members)
    );
    let n_links = d
        .adjacencies
        .iter()
        .filter(|a| matches!(a.over, Over::Link(_)))
        .count();
    let _ = writeln!(
        s,
        "    adjacencies: {} ({} over links, {} over lower DIFs)",
        d.adjacencies.len(),
        n_links,
        d.adjacencies.len() - n_links
    );
    let _ = writeln!(s, "    bootstrap: {}", node(d.bootstrap));
    let order: Vec<String> = d
        .enrollment_order
        .iter()
        .map(|&m| match d.enrolls_via.get(&m) {
            Some(&via) => format!("{} (via {})", node(m), node(via)),
            None => node(m).to_string(),
        })
        .collect();
    let _ = writeln!(s, "    enrollment: {}", order.join(", "));
    let policy = serde_json::to_value(&d.scheduler)
        .ok()
        .and_then(|v| v.get("policy").and_then(|p| p.as_str().map(String::from)))
        .unwrap_or_else(|| "?".into());
    let _ = writeln!(s, "    scheduler: {policy}");
    if !d.cubes.is_empty() {
        let _ = writeln!(s, "    cubes: {}", describe_cubes(d));
    }
}

/// A DIF's QoS cubes on one line.
fn describe_cubes(d: &resolve::Dif) -> String {
    let cubes: Vec<String> = d
        .cubes
        .iter()
        .map(|c| {
            format!(
                "{} (id {}, urgency {}, cherish {}{})",
                c.name,
                c.id,
                c.urgency,
                c.cherish,
                if c.reliable { ", reliable" } else { "" }
            )
        })
        .collect();
    cubes.join("; ")
}

/// The applications, if any.
fn describe_apps(s: &mut String, e: &Experiment) {
    if e.apps.is_empty() {
        return;
    }
    let _ = writeln!(s, "applications ({}):", e.apps.len());
    for a in &e.apps {
        let _ = writeln!(
            s,
            "  {} at {} in {} ({})",
            a.name,
            node_name(e, a.node),
            e.difs.get(a.dif).map_or("?", |d| d.name.as_str()),
            format!("{:?}", a.role).to_lowercase()
        );
    }
}

/// Flows per class, in the order the classes first appear.
fn describe_flows(s: &mut String, e: &Experiment) {
    let mut order: Vec<(&str, &'static str)> = Vec::new();
    let mut count: BTreeMap<(&str, &'static str), usize> = BTreeMap::new();
    for f in &e.flows {
        let kind = match f.kind {
            TrafficKind::Tgen => "tgen",
            TrafficKind::Echo => "echo",
            TrafficKind::Perf => "perf",
        };
        let k = (f.class.as_str(), kind);
        if !order.contains(&k) {
            order.push(k);
        }
        *count.entry(k).or_default() += 1;
    }
    let _ = writeln!(s, "flows ({}), per class:", e.flows.len());
    for k in order {
        let _ = writeln!(s, "  {:<28} {:<5} {:>5}", k.0, k.1, count[&k]);
    }
}

/// The events, if any.
fn describe_events(s: &mut String, e: &Experiment) {
    if e.events.is_empty() {
        return;
    }
    let _ = writeln!(s, "events ({}):", e.events.len());
    for ev in &e.events {
        let what = match ev.what {
            EventKind::LinkDown(l) => format!("link {} down", link_name(e, l)),
            EventKind::LinkUp(l) => format!("link {} up", link_name(e, l)),
            EventKind::NodeStop(n) => format!("node {} stops", node_name(e, n)),
            EventKind::NodeStart(n) => format!("node {} starts", node_name(e, n)),
            EventKind::AppMove { app, to } => format!(
                "{} moves to {}",
                e.apps.get(app).map_or("?", |a| a.name.as_str()),
                node_name(e, to)
            ),
        };
        let _ = writeln!(s, "  at {}: {what}", dur(ev.at));
    }
}

/// The name of node `i` (`?` if there is none).
fn node_name(e: &Experiment, i: usize) -> &str {
    e.nodes.get(i).map_or("?", |n| n.as_str())
}

fn link_name(e: &Experiment, l: usize) -> &str {
    e.links.get(l).map_or("?", |x| x.name.as_str())
}

// ---------------------------------------------------------------- run

/// `YYYYMMDD-HHMMSSZ` of now, UTC.
fn utc_stamp() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}{m:02}{d:02}-{:02}{:02}{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// A variant name as a folder name.
fn folder_name(v: &str) -> String {
    let s: String = v
        .chars()
        .map(|c| {
            if c.is_alphanumeric() || "-_.+=".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    if s.is_empty() || s.starts_with('.') {
        format!("_{s}")
    } else {
        s
    }
}

fn mkdir(p: &Path) -> Result<(), Fail> {
    std::fs::create_dir_all(p).map_err(|e| Fail::failed(format!("{}: {e}", p.display())))
}

fn write(p: &Path, body: &[u8]) -> Result<(), Fail> {
    std::fs::write(p, body).map_err(|e| Fail::failed(format!("{}: {e}", p.display())))
}

fn write_experiment(dir: &Path, e: &Experiment) -> Result<(), Fail> {
    let json = serde_json::to_string_pretty(e)
        .map_err(|err| Fail::failed(format!("experiment.json: {err}")))?;
    write(&dir.join("experiment.json"), json.as_bytes())
}

/// One finished run.
struct Done {
    dir: PathBuf,
    out: RunOutput,
    plots: Vec<PathBuf>,
}

/// `run`: runs the experiments asked for, one after the other.
fn cmd_run(a: RunArgs) -> Result<u8, Fail> {
    let text = read_file(&a.file)?;
    let exps = run_experiments(&a, &text)?;
    let be = pick_backend(&a)?;
    be.check()?;
    let mut session = Session::start(&a, &text, be, &exps)?;
    for (i, exp) in exps.iter().enumerate() {
        if let Some(code) = session.run_one(i, exp)? {
            return Ok(code);
        }
    }
    session.finish()
}

/// The experiments `run` is asked for, resized, scaled or dilated.
fn run_experiments(a: &RunArgs, text: &str) -> Result<Vec<Experiment>, Fail> {
    let mut exps = resolve_all(&a.file, text, &a.variants)?;
    if let Some(d) = a.duration {
        exps = exps.into_iter().map(|e| e.resized(d)).collect();
    }
    if let Some(f) = a.scale {
        let r = rina_lab::resolve::SCALE_RANGE;
        if !r.contains(&f) {
            return Err(Fail::usage(format!(
                "--scale {} is not between {} and {}",
                short_num(f),
                r.start(),
                r.end()
            )));
        }
        exps = exps.into_iter().map(|e| e.scaled(f)).collect();
    }
    if let Some(f) = a.dilate {
        let min = rina_lab::resolve::MIN_DILATION;
        if !(min..=1.0).contains(&f) {
            return Err(Fail::usage(format!(
                "--dilate {} is not between {min} (a hundred times slower) and 1 \
                 (0.05 runs twenty times slower)",
                short_num(f)
            )));
        }
        exps = exps.into_iter().map(|e| e.dilated(f)).collect();
    }
    Ok(exps)
}

/// `f` as written on a command line: `1e-30`, not 30 zeros.
fn short_num(f: f64) -> String {
    if f != 0.0 && f.is_finite() && !(1e-4..1e6).contains(&f.abs()) {
        format!("{f:e}")
    } else {
        f.to_string()
    }
}

/// The backend `run` is asked for (`--backend`, `--inventory`, `--engine`).
fn pick_backend(a: &RunArgs) -> Result<Box<dyn backend::Backend>, Fail> {
    if a.inventory.is_some() && a.backend != "ssh" {
        return Err(Fail::usage(format!(
            "--inventory is for the ssh backend, not {}",
            a.backend
        )));
    }
    Ok(match (&a.engine, a.backend.as_str()) {
        (None, "ssh") => {
            let path = a
                .inventory
                .as_ref()
                .ok_or_else(|| Fail::usage("--backend ssh needs --inventory FILE"))?;
            let inv = backend::ssh::Inventory::load(path)
                .map_err(|e| Fail::usage(format!("--inventory: {e}")))?;
            Box::new(backend::ssh::Ssh::new(inv))
        }
        (None, _) => backend::by_name(&a.backend).map_err(|e| match e {
            LabError::Unsupported { reason, .. } => Fail::usage(format!("--backend: {reason}")),
            e => Fail::usage(e.to_string()),
        })?,
        (Some(e), "sim") => Box::new(backend::sim::Sim {
            engine: Some(
                backend::sim::Engine::by_name(e)
                    .map_err(|r| Fail::usage(format!("--engine: {r}")))?,
            ),
            ..Default::default()
        }),
        (Some(_), other) => {
            return Err(Fail::usage(format!(
                "--engine is for the sim backend, not {other}"
            )))
        }
    })
}

/// Ctrl-C (or SIGTERM) sets the returned flag the backends watch; a second
/// one exits at once.
fn catch_signals() -> Result<Arc<AtomicBool>, Fail> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register_conditional_shutdown(
            sig,
            EXIT_INTERRUPTED.into(),
            stop.clone(),
        )
        .and_then(|_| signal_hook::flag::register(sig, stop.clone()))
        .map_err(|e| Fail::failed(format!("cannot catch signals: {e}")))?;
    }
    Ok(stop)
}

/// The progress bar of one run, `prefix` before it.
fn progress_bar(prefix: String) -> ProgressBar {
    let bar = ProgressBar::new(1000);
    bar.set_style(
        ProgressStyle::with_template(
            "{prefix} [{elapsed_precise}] [{bar:30}] {percent:>3}% {wide_msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    bar.set_prefix(prefix);
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}

/// One `run` command: what its runs share and what they have produced.
struct Session<'a> {
    /// The command line.
    args: &'a RunArgs,
    /// The experiment file's text (copied into the results).
    text: &'a str,
    /// The results folder.
    root: PathBuf,
    /// The experiment file's name in the results.
    file_name: OsString,
    /// Set on Ctrl-C.
    stop: Arc<AtomicBool>,
    /// Where the runs run.
    be: Box<dyn backend::Backend>,
    /// How many runs there are.
    total: usize,
    /// The runs finished so far.
    done: Vec<Done>,
    /// How many runs failed.
    failures: usize,
    /// Whether drawing some plots failed.
    plot_failed: bool,
}

impl<'a> Session<'a> {
    /// Makes the results folder, copies the experiment file in and catches signals.
    fn start(
        args: &'a RunArgs,
        text: &'a str,
        be: Box<dyn backend::Backend>,
        exps: &[Experiment],
    ) -> Result<Self, Fail> {
        let root = args.out.clone().unwrap_or_else(|| {
            PathBuf::from("results")
                .join(folder_name(&exps[0].name))
                .join(format!("{}-{}", utc_stamp(), be.name()))
        });
        mkdir(&root)?;
        let file_name = args
            .file
            .file_name()
            .map_or_else(|| "experiment.toml".into(), |n| n.to_os_string());
        write(&root.join(&file_name), text.as_bytes())?;
        let stop = catch_signals()?;
        Ok(Session {
            args,
            text,
            root,
            file_name,
            stop,
            be,
            total: exps.len(),
            done: Vec::new(),
            failures: 0,
            plot_failed: false,
        })
    }

    /// Runs experiment `i`; `Some(code)` if `run` must exit with it now.
    fn run_one(&mut self, i: usize, exp: &Experiment) -> Result<Option<u8>, Fail> {
        let label = exp.variant.clone().unwrap_or_else(|| exp.name.clone());
        let dir = self.run_dir(exp)?;
        let (out, used) = match self.run_backend(i, exp, &label, &dir) {
            Ok(x) => x,
            Err(LabError::Interrupted) => {
                eprintln!(
                    "rina-lab: interrupted during {label}; everything started was stopped; \
                     results so far in {}",
                    self.root.display()
                );
                return Ok(Some(EXIT_INTERRUPTED));
            }
            Err(e) => {
                eprintln!("rina-lab: {label}: {e}");
                self.failures += 1;
                return Ok(None);
            }
        };
        self.record(exp, &label, dir, out, used)?;
        if self.stop.load(Ordering::Relaxed) {
            eprintln!("rina-lab: interrupted");
            return Ok(Some(EXIT_INTERRUPTED));
        }
        Ok(None)
    }

    /// The folder of the run of `exp`, made, with the experiment written in.
    fn run_dir(&self, exp: &Experiment) -> Result<PathBuf, Fail> {
        let dir = match (&exp.variant, self.total > 1) {
            (Some(v), true) => self.root.join(folder_name(v)),
            _ => self.root.clone(),
        };
        mkdir(&dir.join("logs"))?;
        if dir != self.root {
            write(&dir.join(&self.file_name), self.text.as_bytes())?;
        }
        write_experiment(&dir, exp)?;
        Ok(dir)
    }

    /// Runs experiment `i` on the backend with a progress bar; fills in the wall time.
    fn run_backend(
        &mut self,
        i: usize,
        exp: &Experiment,
        label: &str,
        dir: &Path,
    ) -> Result<(RunOutput, Experiment), LabError> {
        let bar = progress_bar(format!("[{}/{}] {label}", i + 1, self.total));
        let pb = bar.clone();
        let progress = move |f: f64, what: &str| {
            let f = if f.is_finite() {
                f.clamp(0.0, 1.0)
            } else {
                0.0
            };
            pb.set_position((f * 1000.0) as u64);
            pb.set_message(what.to_string());
        };
        let ctx = RunCtx {
            dir,
            progress: &progress,
            stop: &self.stop,
        };
        let t0 = Instant::now();
        let r = backend::run(self.be.as_mut(), exp, &ctx);
        bar.finish_and_clear();
        r.map(|(mut out, used)| {
            if out.wall_time_s == 0.0 {
                out.wall_time_s = t0.elapsed().as_secs_f64();
            }
            (out, used)
        })
    }

    /// Completes and writes the results of a finished run, draws its plots
    /// and prints its summary.
    fn record(
        &mut self,
        exp: &Experiment,
        label: &str,
        dir: PathBuf,
        mut out: RunOutput,
        used: Experiment,
    ) -> Result<(), Fail> {
        if out.experiment.is_empty() {
            out.experiment = exp.name.clone();
        }
        if out.backend.is_empty() {
            out.backend = self.be.name().to_string();
        }
        if out.variant.is_none() {
            out.variant = exp.variant.clone();
        }
        if exp.load.is_some() {
            // The calibrated rates are what ran.
            write_experiment(&dir, &used)?;
        }
        out.write(&dir)?;
        let plots = self.plot(&out, &dir, label);
        if !self.args.json {
            say!("{}", out.summary_table());
            if !plots.is_empty() {
                say!("plots: {}", dir.join("plots").display());
            }
            say!("results: {}\n", dir.display());
        }
        self.done.push(Done { dir, out, plots });
        Ok(())
    }

    /// The plots of one run (none with `--no-plots` or if drawing fails).
    fn plot(&mut self, out: &RunOutput, dir: &Path, label: &str) -> Vec<PathBuf> {
        if self.args.no_plots {
            return Vec::new();
        }
        match plot_run(out, &dir.join("plots")) {
            Ok(p) => p,
            Err(e) => {
                eprintln!("rina-lab: plots of {label}: {e}");
                self.plot_failed = true;
                Vec::new()
            }
        }
    }

    /// Draws the comparison plots, prints the outcome and gives the exit code.
    fn finish(mut self) -> Result<u8, Fail> {
        let mut compare = Vec::new();
        if self.done.len() > 1 && !self.args.no_plots {
            let runs: Vec<RunOutput> = self.done.iter().map(|d| d.out.clone()).collect();
            match plot_compare(&runs, &self.root.join("plots")) {
                Ok(p) => compare = p,
                Err(e) => {
                    eprintln!("rina-lab: comparison plots: {e}");
                    self.plot_failed = true;
                }
            }
        }
        if self.args.json {
            self.print_json(&compare);
        } else if !compare.is_empty() {
            say!("comparison plots: {}", self.root.join("plots").display());
        }
        if self.failures > 0 {
            return Err(Fail::failed(format!(
                "{} of {} run(s) failed; results in {}",
                self.failures,
                self.total,
                self.root.display()
            )));
        }
        Ok(if self.plot_failed { EXIT_FAILED } else { 0 })
    }

    /// Prints the outcome of every run as JSON (`--json`).
    fn print_json(&self, compare: &[PathBuf]) {
        let runs: Vec<serde_json::Value> = self
            .done
            .iter()
            .map(|d| {
                serde_json::json!({
                    "dir": d.dir,
                    "experiment": d.out.experiment,
                    "variant": d.out.variant,
                    "backend": d.out.backend,
                    "duration_s": d.out.duration_s,
                    "wall_time_s": d.out.wall_time_s,
                    "summary": d.out.summary(),
                    "plots": d.plots,
                })
            })
            .collect();
        let v = serde_json::json!({
            "dir": self.root,
            "runs": runs,
            "failed": self.failures,
            "comparison_plots": compare,
        });
        say!(
            "{}",
            serde_json::to_string_pretty(&v).unwrap_or_else(|_| "{}".into())
        );
    }
}

// ---------------------------------------------------------------- plot, show

/// The run folders below `dirs`, one group per folder given: a folder
/// with `run.json`, or the folders in it that have one (one per variant).
fn expand(dirs: &[PathBuf]) -> Result<Vec<Vec<PathBuf>>, Fail> {
    let mut out = Vec::new();
    for d in dirs {
        if d.join("run.json").is_file() {
            out.push(vec![d.clone()]);
            continue;
        }
        let mut subs: Vec<PathBuf> = std::fs::read_dir(d)
            .map_err(|e| Fail::failed(format!("{}: {e}", d.display())))?
            .filter_map(|x| x.ok().map(|x| x.path()))
            .filter(|p| p.join("run.json").is_file())
            .collect();
        if subs.is_empty() {
            return Err(Fail::failed(format!(
                "{}: no run.json here or in its folders",
                d.display()
            )));
        }
        subs.sort();
        out.push(subs);
    }
    Ok(out)
}

/// The runs of `dirs` ([`expand`]). A folder given that is not a run
/// stands for the variants of one run: one holding runs of several
/// experiments (a results folder, /tmp) is refused rather than taken
/// whole (`plot` would redraw every run in it).
fn read_runs(dirs: &[PathBuf]) -> Result<Vec<(PathBuf, RunOutput)>, Fail> {
    let dirs: Vec<PathBuf> = dirs
        .iter()
        .filter(|d| !beside_variants(d))
        .cloned()
        .collect();
    let mut out = Vec::new();
    for (given, group) in dirs.iter().zip(expand(&dirs)?) {
        let runs: Vec<(PathBuf, RunOutput)> = group
            .into_iter()
            .map(|d| RunOutput::read(&d).map(|r| (d, r)).map_err(Fail::from))
            .collect::<Result<_, _>>()?;
        let mut names: Vec<&str> = runs.iter().map(|(_, r)| r.experiment.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        if names.len() > 1 {
            return Err(Fail::failed(format!(
                "{}: holds runs of {} experiments ({}), not the variants of one run; \
                 give the run folders themselves",
                given.display(),
                names.len(),
                names.join(", ")
            )));
        }
        out.extend(runs);
    }
    Ok(out)
}

/// Whether `p` is what `run` writes beside the variants of a run (the
/// experiment file's copy, the comparison plots), which `<run>/*` expands
/// to: not a run itself, so left out.
fn beside_variants(p: &Path) -> bool {
    let written = p.is_file()
        || p.file_name()
            .is_some_and(|n| n == "plots" || n == "compare-plots");
    let variants = || {
        p.parent()
            .and_then(|up| std::fs::read_dir(up).ok())
            .is_some_and(|mut e| e.any(|x| x.is_ok_and(|x| x.path().join("run.json").is_file())))
    };
    written && !p.join("run.json").is_file() && variants()
}

/// The deepest folder holding every one of `dirs`.
fn common_parent(dirs: &[PathBuf]) -> PathBuf {
    let abs: Vec<PathBuf> = dirs
        .iter()
        .map(|d| std::fs::canonicalize(d).unwrap_or_else(|_| d.clone()))
        .collect();
    let mut common: Vec<_> = match abs.first() {
        Some(p) => p.components().collect(),
        None => return PathBuf::from("."),
    };
    for p in &abs[1..] {
        let n = common
            .iter()
            .zip(p.components())
            .take_while(|(a, b)| **a == *b)
            .count();
        common.truncate(n);
    }
    if common.is_empty() {
        PathBuf::from(".")
    } else {
        common.iter().collect()
    }
}

fn cmd_plot(dirs: &[PathBuf], out: Option<PathBuf>) -> Result<u8, Fail> {
    let runs = read_runs(dirs)?;
    for (d, r) in &runs {
        let p = plot_run(r, &d.join("plots")).map_err(|e| Fail::failed(e.to_string()))?;
        if p.is_empty() {
            say!("{}: nothing to plot", d.display());
        } else {
            say!(
                "{}: {} plot file(s) in {}",
                d.display(),
                p.len(),
                d.join("plots").display()
            );
        }
    }
    if runs.len() > 1 {
        let dir = out.unwrap_or_else(|| match dirs {
            [one] => one.join("plots"),
            _ => common_parent(dirs).join("compare-plots"),
        });
        let all: Vec<RunOutput> = runs.into_iter().map(|(_, r)| r).collect();
        let p = plot_compare(&all, &dir).map_err(|e| Fail::failed(e.to_string()))?;
        if !p.is_empty() {
            say!("comparison plots: {}", dir.display());
        }
    }
    Ok(0)
}

fn cmd_report(
    dirs: &[PathBuf],
    reference: Option<PathBuf>,
    out: Option<PathBuf>,
    scale: f64,
) -> Result<u8, Fail> {
    if !(scale > 0.0 && scale.is_finite()) {
        return Err(Fail::usage(format!("--scale {scale} is not above 0")));
    }
    let runs: Vec<RunOutput> = read_runs(dirs)?.into_iter().map(|(_, r)| r).collect();
    let dilated = runs.iter().filter_map(|r| r.dilation).next();
    let runs: Vec<RunOutput> = runs.into_iter().map(|r| r.in_original_time()).collect();
    let name = &runs[0].experiment;
    let (r, source) = match &reference {
        Some(path) => (
            rina_lab::report::Reference::read(path),
            path.display().to_string(),
        ),
        None => (
            rina_lab::report::Reference::built_in(name),
            format!("examples/lab/reference/{name}.toml (built in)"),
        ),
    };
    let mut r = r.map_err(|e| Fail::failed(e.to_string()))?;
    for l in &mut r.limit {
        l.bps *= scale;
    }
    let dir = out.unwrap_or_else(|| dirs[0].clone());
    mkdir(&dir)?;
    let md = format!(
        "# {} beside the paper\n\nMade by `rina-lab report` from {}; reference {}.{}\n\n{}",
        runs[0].experiment,
        dirs.iter()
            .map(|d| format!("`{}`", d.display()))
            .collect::<Vec<_>>()
            .join(", "),
        source,
        match dilated {
            Some(f) => format!(
                " Run in time dilated {:.0}x (`--dilate {f}`): delays and rates are \
                 given in the original's time (measured delays times {f}, rates over {f}).",
                1.0 / f
            ),
            None => String::new(),
        },
        rina_lab::report::markdown(&runs, &r)
    );
    write(&dir.join("report.md"), md.as_bytes())?;
    let (classes, series) = rina_lab::report::delay_series(&runs, &r);
    rina_lab::plot::plot_reference(&classes, &series, &dir.join("plots"))
        .map_err(|e| Fail::failed(e.to_string()))?;
    say_raw!("{md}");
    say!("report: {}", dir.join("report.md").display());
    Ok(0)
}

fn cmd_show(dirs: &[PathBuf], json: bool) -> Result<u8, Fail> {
    let runs = read_runs(dirs)?;
    if json {
        let v: Vec<serde_json::Value> = runs
            .iter()
            .map(|(d, r)| {
                serde_json::json!({
                    "dir": d,
                    "experiment": r.experiment,
                    "variant": r.variant,
                    "backend": r.backend,
                    "duration_s": r.duration_s,
                    "wall_time_s": r.wall_time_s,
                    "summary": r.summary(),
                })
            })
            .collect();
        say!(
            "{}",
            serde_json::to_string_pretty(&v).unwrap_or_else(|_| "[]".into())
        );
        return Ok(0);
    }
    for (d, r) in &runs {
        say!("{}", d.display());
        say_raw!("{}", r.summary_table());
        let failed = r.flows.iter().filter(|f| f.error.is_some()).count();
        say!(
            "{} flow(s) ({} failed), {} delay samples, {} goodput points, {} links",
            r.flows.len(),
            failed,
            r.samples.len(),
            r.goodput.len(),
            r.links.len()
        );
        let busiest = r
            .links
            .iter()
            .filter(|l| l.rate_bps > 0.0)
            .map(|l| (l, l.avg_bps_ab.max(l.avg_bps_ba) / l.rate_bps))
            .max_by(|a, b| a.1.total_cmp(&b.1));
        if let Some((l, load)) = busiest {
            say!(
                "busiest link: {} at {:.1}% of {} ({} frames dropped)",
                l.link,
                load * 100.0,
                rate(l.rate_bps),
                l.dropped
            );
        }
        let plots = d.join("plots");
        if plots.is_dir() {
            say!("plots: {}", plots.display());
        }
        say!();
    }
    Ok(0)
}
