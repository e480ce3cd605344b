//! From the file as written to a checked [`Experiment`]: every name resolved
//! to an index, groups expanded, adjacencies, bootstrap members and
//! enrollment order derived, traffic matrices expanded into flows, a
//! variant applied. Every error names the line (and column) it is about.

use crate::model::{self, AppRole, File, TrafficKind};
use crate::LabError;
use nodes::Ctx;
use rina_core::rmt::SchedulerConfig;
use rina_tools::tgen::gen::Profile;
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::Duration;

mod apps;
mod calibration;
mod difs;
mod events;
mod links;
mod nodes;
mod traffic;

/// Rate of a link declared without one: 10 Gb/s ("unlimited").
pub const UNLIMITED_BPS: f64 = 10e9;
/// Default transmit queue of a link, frames.
pub const DEFAULT_LINK_QUEUE: usize = 1000;
/// The smallest time dilation `run --dilate` takes: a hundred times
/// slower. A year (the longest duration a file takes) dilated by it stays
/// far within the simulator's clock (584 years of nanoseconds).
pub const MIN_DILATION: f64 = 0.01;
/// The range of `run --scale`: a link at the slowest rate a file takes
/// (1 kbit/s) still sends a frame within hours, rates stay finite.
pub const SCALE_RANGE: std::ops::RangeInclusive<f64> = 1e-3..=1e3;

/// A checked experiment, ready for a backend.
#[derive(Debug, Clone, Serialize)]
pub struct Experiment {
    /// Short name.
    pub name: String,
    /// What it reproduces.
    pub description: String,
    /// The variant applied, if any.
    pub variant: Option<String>,
    /// How long traffic runs.
    pub duration: Duration,
    /// Seed of every random draw.
    pub seed: u64,
    /// Warm-up before traffic, if the file fixes it.
    pub warmup: Option<Duration>,
    /// Node names; a node is its index here.
    pub nodes: Vec<String>,
    /// Links.
    pub links: Vec<Link>,
    /// Normal DIFs, lower DIFs before the DIFs over them.
    pub difs: Vec<Dif>,
    /// Registered applications.
    pub apps: Vec<App>,
    /// Flows, matrices expanded.
    pub flows: Vec<Flow>,
    /// Timed events, in time order.
    pub events: Vec<Event>,
    /// Load calibration.
    pub load: Option<Load>,
    /// Time dilation applied ([`Experiment::dilated`]): the run's times are
    /// the original's divided by this (0.05: twenty times slower).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dilation: Option<f64>,
}

/// A point-to-point link (a shim DIF of its own).
#[derive(Debug, Clone, Serialize)]
pub struct Link {
    /// Name (`a--b` unless given).
    pub name: String,
    /// One end (node index).
    pub a: usize,
    /// The other end.
    pub b: usize,
    /// Rate, bit/s.
    pub rate_bps: f64,
    /// One-way propagation delay.
    pub delay: Duration,
    /// Loss probability per frame.
    pub loss: f64,
    /// Transmit queue, frames.
    pub queue: usize,
    /// Groups it belongs to.
    pub groups: Vec<String>,
}

/// What an adjacency of a normal DIF runs over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum Over {
    /// A link (index into [`Experiment::links`]).
    Link(usize),
    /// A flow of a lower normal DIF (index into [`Experiment::difs`]).
    Dif(usize),
}

/// What a normal DIF runs over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Lower {
    /// The link shims between members.
    Links,
    /// A lower normal DIF (index into [`Experiment::difs`]).
    Dif(usize),
}

/// Two members of a DIF that are neighbours.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Adjacency {
    /// One member (node index).
    pub a: usize,
    /// The other.
    pub b: usize,
    /// The N-1 flow between them.
    pub over: Over,
}

/// A QoS cube of a DIF.
#[derive(Debug, Clone, Serialize)]
pub struct Cube {
    /// Name.
    pub name: String,
    /// QoS-id.
    pub id: u64,
    /// Urgency level, 0 = most urgent.
    pub urgency: u8,
    /// Cherish level, 0 = most cherished.
    pub cherish: u8,
    /// Retransmission, in order.
    pub reliable: bool,
    /// The cube id of each lower DIF (by DIF index) that carries it.
    pub maps_to: BTreeMap<usize, u64>,
    /// Declared average bandwidth, bit/s.
    pub bandwidth_bps: Option<f64>,
    /// Declared delay bound.
    pub delay: Option<Duration>,
    /// Keepalive interval of its flows.
    pub keepalive: Option<Duration>,
    /// Declared loss bound.
    pub loss: Option<f64>,
    /// EFCP policies over the cube's defaults.
    pub efcp: rina_core::efcp::EfcpTuning,
}

/// A normal DIF.
#[derive(Debug, Clone, Serialize)]
pub struct Dif {
    /// Name.
    pub name: String,
    /// Member nodes, in the order written.
    pub members: Vec<usize>,
    /// What it runs over.
    pub over: Vec<Lower>,
    /// Neighbour pairs.
    pub adjacencies: Vec<Adjacency>,
    /// RMT policy of every port.
    pub scheduler: SchedulerConfig,
    /// QoS cubes.
    pub cubes: Vec<Cube>,
    /// Enrollment password.
    pub password: Option<String>,
    /// Largest PDU, if fixed.
    pub max_pdu: Option<u32>,
    /// The member that bootstraps the DIF (most neighbours, first written
    /// on a tie).
    pub bootstrap: usize,
    /// Members in the order they can enroll (breadth first from the
    /// bootstrap member over the adjacencies).
    pub enrollment_order: Vec<usize>,
    /// The neighbour each member enrolls through (none for the bootstrap).
    pub enrolls_via: BTreeMap<usize, usize>,
}

impl Dif {
    /// The cube with QoS-id `id`.
    pub fn cube(&self, id: u64) -> Option<&Cube> {
        self.cubes.iter().find(|c| c.id == id)
    }

    /// Whether `node` is a member.
    pub fn has_member(&self, node: usize) -> bool {
        self.members.contains(&node)
    }
}

/// A registered application.
#[derive(Debug, Clone, Serialize)]
pub struct App {
    /// Name.
    pub name: String,
    /// Node it starts at.
    pub node: usize,
    /// DIF (index).
    pub dif: usize,
    /// Echo or sink.
    pub role: AppRole,
}

/// Where a flow goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Dest {
    /// An implicit receiver at this node.
    Node(usize),
    /// A registered application (wherever it is at the time).
    App(usize),
}

/// One flow to run.
#[derive(Debug, Clone, Serialize)]
pub struct Flow {
    /// Unique id (`t0.hd-video-call.pe-0-0>hr-0-1-0`).
    pub id: String,
    /// tgen, echo or perf.
    pub kind: TrafficKind,
    /// DIF (index); for a flow over a link shim (`shim` set), the lowest
    /// normal DIF over that link, for reference only.
    pub dif: usize,
    /// Some(link): the flow runs directly over this link's shim DIF.
    pub shim: Option<usize>,
    /// Class (summary row).
    pub class: String,
    /// QoS-id of the cube asked for.
    pub cube: u64,
    /// Sending node.
    pub from: usize,
    /// Destination.
    pub to: Dest,
    /// tgen: the source.
    pub profile: Option<Profile>,
    /// echo: time between probes.
    pub interval: Duration,
    /// echo: probe size, bytes.
    pub size: usize,
    /// perf: SDU sizes.
    pub sdu_sizes: Vec<usize>,
    /// perf: time per size.
    pub per_size: Duration,
    /// Start, from the start of traffic.
    pub start: Duration,
    /// Stop, from the start of traffic.
    pub stop: Duration,
}

/// A timed event.
#[derive(Debug, Clone, Serialize)]
pub struct Event {
    /// Time from the start of traffic.
    pub at: Duration,
    /// What happens.
    pub what: EventKind,
}

/// What a timed event does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum EventKind {
    /// Link (index) down.
    LinkDown(usize),
    /// Link up again.
    LinkUp(usize),
    /// Node (index) stops.
    NodeStop(usize),
    /// Node starts again.
    NodeStart(usize),
    /// App (index) moves to node.
    AppMove { app: usize, to: usize },
}

/// Load calibration, resolved.
#[derive(Debug, Clone, Serialize)]
pub struct Load {
    /// Target load.
    pub target: f64,
    /// Links calibrated (indices).
    pub links: Vec<usize>,
    /// Length of the calibration run.
    pub duration: Duration,
    /// Classes left out of the calibration run.
    pub without: Vec<String>,
}

impl Experiment {
    /// Index of the node called `name`.
    pub fn node(&self, name: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n == name)
    }

    /// Index of the DIF called `name`.
    pub fn dif(&self, name: &str) -> Option<usize> {
        self.difs.iter().position(|d| d.name == name)
    }

    /// Index of the link called `name`.
    pub fn link(&self, name: &str) -> Option<usize> {
        self.links.iter().position(|l| l.name == name)
    }

    /// The node a flow's destination is at when the experiment starts.
    pub fn dest_node(&self, d: Dest) -> usize {
        match d {
            Dest::Node(n) => n,
            Dest::App(a) => self.apps[a].node,
        }
    }

    /// The same experiment with every link rate, every tgen source's rate
    /// and every rate in the DIFs' scheduling policies multiplied by `f`
    /// (seed 003 on engines that cannot carry the paper's rates: the load,
    /// hence the queueing, stays the same; SDU sizes, delays, bursts and
    /// queue lengths are unchanged).
    pub fn scaled(mut self, f: f64) -> Experiment {
        for l in &mut self.links {
            l.rate_bps *= f;
        }
        for d in &mut self.difs {
            d.scheduler = d.scheduler.scaled(f);
        }
        for fl in &mut self.flows {
            if let Some(p) = &mut fl.profile {
                *p = p.scaled(f);
            }
        }
        self
    }

    /// The same experiment in time dilated by `1/f` (`f` < 1): the rates of
    /// [`Experiment::scaled`] times `f`, and every time of the traffic's
    /// own (link delays, ON-OFF, talk and varying periods, echo intervals,
    /// flow start and stop, events, the run and its load calibration, the
    /// cubes' delay bounds and any EFCP timer a cube sets) divided by `f`.
    /// Every PDU of the original is sent, queued and served `1/f` times
    /// slower, so queueing delays are the original's times `1/f` and their
    /// ratios are kept exactly, where [`Experiment::scaled`] alone would
    /// stretch serialisation but not the bursts (seed 003's best-effort to
    /// urgent ratio falls from 25x to 6x at 1/20). For engines that cannot
    /// carry the original rates (37 daemons on two cores); the run's
    /// delays divided by `1/f` are the original's. `warmup` is left alone:
    /// it is for routing to settle, before any traffic. `run --dilate`
    /// takes `f` from [`MIN_DILATION`] to 1; a time that `f` would carry
    /// past `Duration`'s range saturates there. Echo intervals and EFCP
    /// timers are rounded to whole milliseconds (at least 1), which is
    /// what `rina-echo` and the daemons take.
    pub fn dilated(self, f: f64) -> Experiment {
        let mut e = self;
        let d = |x: Duration| saturating_secs(x.as_secs_f64() / f);
        let ms = |x: &mut Option<u64>| {
            if let Some(v) = x {
                *v = ((*v as f64) / f).round().max(1.0) as u64;
            }
        };
        for l in &mut e.links {
            l.rate_bps *= f;
            l.delay = d(l.delay);
        }
        for dif in &mut e.difs {
            dif.scheduler = dif.scheduler.scaled(f);
            for c in &mut dif.cubes {
                c.delay = c.delay.map(d);
                c.keepalive = c
                    .keepalive
                    .map(|k| d(k).max(rina_core::normal::keepalive::MIN_KEEPALIVE));
                ms(&mut c.efcp.a_timer_ms);
                ms(&mut c.efcp.initial_rto_ms);
                ms(&mut c.efcp.min_rto_ms);
                ms(&mut c.efcp.max_rto_ms);
                ms(&mut c.efcp.rate_frame_ms);
            }
        }
        for fl in &mut e.flows {
            if let Some(p) = &mut fl.profile {
                *p = p.dilated(f);
            }
            // An echo interval stays whole milliseconds (at least one), as
            // rina-echo sends it, so that every backend runs the same one
            // (other flows have none).
            if !fl.interval.is_zero() {
                let iv_ms = (d(fl.interval).as_secs_f64() * 1e3).round().max(1.0);
                fl.interval = Duration::from_millis(iv_ms as u64);
            }
            fl.per_size = d(fl.per_size);
            fl.start = d(fl.start);
            fl.stop = d(fl.stop);
        }
        for ev in &mut e.events {
            ev.at = d(ev.at);
        }
        if let Some(l) = &mut e.load {
            l.duration = d(l.duration);
        }
        e.duration = d(e.duration);
        e.dilation = Some(e.dilation.unwrap_or(1.0) * f);
        e
    }

    /// The same experiment shortened to `duration` (for CI and quick looks):
    /// traffic start and stop times, per-size perf time and event times are
    /// scaled by the same factor; rates and sizes are unchanged. A longer
    /// `duration` changes nothing (see [`Experiment::resized`]).
    pub fn shortened(self, duration: Duration) -> Experiment {
        if duration >= self.duration {
            return self;
        }
        self.resized(duration)
    }

    /// The same experiment run for `duration`, shorter or longer (a
    /// full-length run of a file that CI runs shortened): traffic start
    /// and stop times, per-size perf time and event times are scaled by the
    /// same factor; rates and sizes are unchanged; the load calibration
    /// runs for its own duration, at most `duration`. A time scaled past
    /// [`MAX_DURATION`](crate::units::MAX_DURATION) (a per-size perf time
    /// longer than the experiment, lengthened a lot) is cut to it.
    pub fn resized(mut self, duration: Duration) -> Experiment {
        let f = duration.as_secs_f64() / self.duration.as_secs_f64().max(1e-9);
        let scale =
            |d: Duration| saturating_secs(d.as_secs_f64() * f).min(crate::units::MAX_DURATION);
        for fl in &mut self.flows {
            fl.start = scale(fl.start);
            fl.stop = scale(fl.stop);
            fl.per_size = scale(fl.per_size);
        }
        for e in &mut self.events {
            e.at = scale(e.at);
        }
        if let Some(l) = &mut self.load {
            l.duration = l.duration.min(duration);
        }
        self.duration = duration;
        self
    }
}

/// `secs` seconds as a duration: zero below 0 (and for NaN), the largest
/// duration above it (where `Duration::from_secs_f64` panics).
fn saturating_secs(secs: f64) -> Duration {
    if secs.is_nan() || secs <= 0.0 {
        return Duration::ZERO;
    }
    Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX)
}

/// Where in the file: turns byte offsets into 1-based line and column.
pub struct Source<'a> {
    text: &'a str,
}

impl<'a> Source<'a> {
    /// The file's text.
    pub fn new(text: &'a str) -> Self {
        Source { text }
    }

    /// Line and column (1-based) of byte `offset`.
    pub fn line_col(&self, offset: usize) -> (usize, usize) {
        let offset = offset.min(self.text.len());
        let before = &self.text[..offset];
        let line = before.matches('\n').count() + 1;
        let col = offset - before.rfind('\n').map(|i| i + 1).unwrap_or(0) + 1;
        (line, col)
    }

    /// An error about the thing spanning `span`.
    pub fn err(&self, span: std::ops::Range<usize>, msg: impl Into<String>) -> LabError {
        let (line, col) = self.line_col(span.start);
        LabError::At {
            line,
            col,
            msg: msg.into(),
        }
    }
}

/// Parses an experiment file (TOML) without resolving it. A value
/// refused is named by its key (`` `keepalive`: `abc` is not a
/// duration ``) as well as its line.
pub fn parse(text: &str) -> Result<File, LabError> {
    toml::from_str::<File>(text).map_err(|e| {
        let src = Source::new(text);
        let (line, col) = e.span().map(|s| src.line_col(s.start)).unwrap_or((0, 0));
        let msg = e.message();
        let msg = match e.span().and_then(|s| key_before(text, s.start)) {
            Some(k) if !msg.contains(&format!("`{k}`")) => format!("`{k}`: {msg}"),
            _ => msg.to_string(),
        };
        LabError::At { line, col, msg }
    })
}

/// The key written just before the value at byte `at` of `text` (`key =`
/// on the same line, in a table or an inline table), if there is one.
fn key_before(text: &str, at: usize) -> Option<&str> {
    let head = text.get(..at)?;
    let line = &head[head.rfind('\n').map_or(0, |i| i + 1)..];
    let key = line.trim_end().strip_suffix('=')?.trim_end();
    let key = key
        .rsplit(|c: char| c.is_whitespace() || c == '{' || c == ',')
        .next()?;
    let bare = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    (!key.is_empty() && key.chars().all(bare)).then_some(key)
}

/// The names of the file's variants, in the order written.
pub fn variant_names(file: &File) -> Vec<String> {
    file.variants
        .iter()
        .map(|v| v.get_ref().name.get_ref().clone())
        .collect()
}

/// Parses and resolves `text`, applying the variant called `variant`.
pub fn load(text: &str, variant: Option<&str>) -> Result<Experiment, LabError> {
    let file = parse(text)?;
    resolve(text, &file, variant)
}

/// Resolves a parsed file (`text` is its source, for line numbers).
pub fn resolve(text: &str, file: &File, variant: Option<&str>) -> Result<Experiment, LabError> {
    let ctx = nodes::resolve_nodes(Source::new(text), file)?;
    check_variant_names(&ctx.src, file)?;
    let var = find_variant(file, variant)?;
    let links = links::resolve_links(&ctx, file, var)?;
    let difs = difs::resolve_difs(&ctx, file, &links, var)?;
    let apps = apps::resolve_apps(&ctx, file, &difs)?;
    let profiles = traffic::resolve_profiles(&ctx.src, file)?;
    let duration = experiment_duration(&ctx.src, file)?;
    let net = Net {
        ctx: &ctx,
        links: &links,
        difs: &difs,
        apps: &apps,
    };
    let flows = traffic::resolve_traffic(&net, file, variant, &profiles, duration)?;
    let events = events::resolve_events(&net, file, duration)?;
    let load = calibration::resolve_load(&ctx.src, file, var, &links, &flows, duration)?;
    Ok(Experiment {
        name: file.experiment.name.clone(),
        description: file.experiment.description.clone(),
        variant: variant.map(str::to_string),
        duration,
        seed: file.experiment.seed,
        warmup: file.experiment.warmup.map(|x| x.get()),
        nodes: ctx.nodes.clone(),
        links,
        difs,
        apps,
        flows,
        events,
        load,
        dilation: None,
    })
}

/// What traffic and events are resolved against: nodes, links, DIFs and
/// applications.
struct Net<'a> {
    ctx: &'a Ctx<'a>,
    links: &'a [Link],
    difs: &'a [Dif],
    apps: &'a [App],
}

/// Checks that every variant's name can be its run's folder: not empty,
/// not a path, not `plots` (the comparison plots' folder beside them),
/// and not repeated (the later run would overwrite the earlier).
fn check_variant_names(src: &Source, file: &File) -> Result<(), LabError> {
    let mut seen = std::collections::BTreeSet::new();
    for v in &file.variants {
        let name = &v.get_ref().name;
        let n = name.get_ref();
        let why = if n.is_empty() || n.starts_with('.') || n.contains(['/', '\\']) {
            format!("variant name `{n}` cannot name a folder (no `/`, `\\` or leading `.`)")
        } else if n == "plots" {
            "variant name `plots` is taken by the comparison plots' folder".to_string()
        } else if !seen.insert(n.as_str()) {
            format!("variant `{n}` is declared twice")
        } else {
            continue;
        };
        return Err(src.err(name.span(), why));
    }
    Ok(())
}

/// Resolves the variant called `variant` to its declaration.
fn find_variant<'f>(
    file: &'f File,
    variant: Option<&str>,
) -> Result<Option<&'f model::VariantDecl>, LabError> {
    let Some(v) = variant else {
        return Ok(None);
    };
    file.variants
        .iter()
        .find(|d| d.get_ref().name.get_ref() == v)
        .map(|d| Some(d.get_ref()))
        .ok_or_else(|| LabError::NoVariant {
            name: v.to_string(),
            known: variant_names(file),
        })
}

/// Resolves the experiment's duration, which must be above zero.
fn experiment_duration(src: &Source, file: &File) -> Result<Duration, LabError> {
    let d = &file.experiment.duration;
    let duration = d.get_ref().get();
    if duration.is_zero() {
        return Err(src.err(d.span(), "`experiment.duration` must be above zero"));
    }
    Ok(duration)
}
