//! From the file as written to a checked [`Experiment`]: every name resolved
//! to an index, groups expanded, adjacencies, bootstrap members and
//! enrollment order derived, traffic matrices expanded into flows, a
//! variant applied. Every error names the line (and column) it is about.

use crate::model::{self, AppRole, EventAction, File, TrafficKind};
use crate::LabError;
use rina_core::rmt::SchedulerConfig;
use rina_tools::tgen::gen::Profile;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;
use toml::Spanned;

/// Rate of a link declared without one: 10 Gb/s ("unlimited").
pub const UNLIMITED_BPS: f64 = 10e9;
/// Default transmit queue of a link, frames.
pub const DEFAULT_LINK_QUEUE: usize = 1000;

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
    /// it is for routing to settle, before any traffic.
    pub fn dilated(self, f: f64) -> Experiment {
        let mut e = self;
        let d = |x: Duration| Duration::from_secs_f64(x.as_secs_f64() / f);
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
            fl.interval = d(fl.interval);
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
    /// runs for its own duration, at most `duration`.
    pub fn resized(mut self, duration: Duration) -> Experiment {
        let f = duration.as_secs_f64() / self.duration.as_secs_f64().max(1e-9);
        let scale = |d: Duration| Duration::from_secs_f64(d.as_secs_f64() * f);
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

/// Parses an experiment file (TOML) without resolving it.
pub fn parse(text: &str) -> Result<File, LabError> {
    toml::from_str::<File>(text).map_err(|e| {
        let src = Source::new(text);
        let (line, col) = e.span().map(|s| src.line_col(s.start)).unwrap_or((0, 0));
        LabError::At {
            line,
            col,
            msg: e.message().to_string(),
        }
    })
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

struct Ctx<'a> {
    src: Source<'a>,
    nodes: Vec<String>,
    groups: BTreeMap<String, Vec<usize>>,
}

impl Ctx<'_> {
    fn node(&self, s: &Spanned<String>) -> Result<usize, LabError> {
        self.nodes
            .iter()
            .position(|n| n == s.get_ref())
            .ok_or_else(|| {
                self.src.err(
                    s.span(),
                    format!("unknown node `{}` (not in `nodes`)", s.get_ref()),
                )
            })
    }

    /// Expands node names, `@group` and `*`.
    fn node_set(&self, list: &[Spanned<String>]) -> Result<Vec<usize>, LabError> {
        let mut out = Vec::new();
        for s in list {
            let name = s.get_ref();
            let add: Vec<usize> = if name == "*" {
                (0..self.nodes.len()).collect()
            } else if let Some(g) = name.strip_prefix('@') {
                self.groups.get(g).cloned().ok_or_else(|| {
                    self.src
                        .err(s.span(), format!("unknown group `{g}` (not in `[groups]`)"))
                })?
            } else {
                vec![self.node(s)?]
            };
            for n in add {
                if !out.contains(&n) {
                    out.push(n);
                }
            }
        }
        Ok(out)
    }
}

/// Resolves a parsed file (`text` is its source, for line numbers).
pub fn resolve(text: &str, file: &File, variant: Option<&str>) -> Result<Experiment, LabError> {
    let src = Source::new(text);
    if let Some(n) = &file.experiment.nodes {
        return Err(src.err(
            n.span(),
            "`nodes` is inside [experiment]: write it at the top of the file, before any [table]",
        ));
    }
    // Nodes and groups.
    let mut nodes: Vec<String> = Vec::new();
    for n in &file.nodes {
        let name = n.get_ref();
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
        {
            return Err(src.err(
                n.span(),
                format!("node name `{name}`: use letters, digits, `-`, `_` and `.` only"),
            ));
        }
        if nodes.contains(name) {
            return Err(src.err(n.span(), format!("node `{name}` is declared twice")));
        }
        nodes.push(name.clone());
    }
    if nodes.is_empty() {
        return Err(LabError::At {
            line: 1,
            col: 1,
            msg: "`nodes` is empty".into(),
        });
    }
    let mut ctx = Ctx {
        src,
        nodes,
        groups: BTreeMap::new(),
    };
    for (g, members) in &file.groups {
        let set = ctx.node_set(members)?;
        ctx.groups.insert(g.clone(), set);
    }
    let src = &ctx.src;

    // Variant.
    let var = match variant {
        None => None,
        Some(v) => Some(
            file.variants
                .iter()
                .find(|d| d.get_ref().name.get_ref() == v)
                .map(|d| d.get_ref())
                .ok_or_else(|| LabError::NoVariant {
                    name: v.to_string(),
                    known: variant_names(file),
                })?,
        ),
    };

    // Links.
    let mut links: Vec<Link> = Vec::new();
    for l in &file.links {
        let d = l.get_ref();
        let a = ctx.node(&d.between[0])?;
        let b = ctx.node(&d.between[1])?;
        if a == b {
            return Err(src.err(l.span(), "a link needs two different nodes"));
        }
        let name = d
            .name
            .clone()
            .unwrap_or_else(|| format!("{}--{}", ctx.nodes[a], ctx.nodes[b]));
        if links.iter().any(|x| x.name == name) {
            return Err(src.err(l.span(), format!("link `{name}` is declared twice")));
        }
        let loss = d.loss.unwrap_or(0.0);
        if !(0.0..1.0).contains(&loss) {
            return Err(src.err(
                l.span(),
                format!("link `{name}`: loss {loss} is not in [0, 1)"),
            ));
        }
        let rate_bps = d.rate.map(|r| r.bps()).unwrap_or(UNLIMITED_BPS);
        if rate_bps <= 0.0 {
            return Err(src.err(l.span(), format!("link `{name}`: rate must be above 0")));
        }
        let queue = d.queue.unwrap_or(DEFAULT_LINK_QUEUE);
        if queue == 0 {
            return Err(src.err(
                l.span(),
                format!("link `{name}`: queue must hold at least one frame"),
            ));
        }
        links.push(Link {
            name,
            a,
            b,
            rate_bps,
            delay: d.delay.map(|x| x.get()).unwrap_or_default(),
            loss,
            queue,
            groups: d.groups.clone(),
        });
    }
    if let Some(v) = var {
        for (sel, rate) in &v.rate {
            let hit = select_links(&links, sel);
            if hit.is_empty() {
                return Err(src.err(
                    v.name.span(),
                    format!("variant: no link or link group `{sel}`"),
                ));
            }
            for i in hit {
                links[i].rate_bps = rate.bps();
            }
        }
    }

    // DIFs, in dependency order.
    let decls: Vec<&Spanned<model::DifDecl>> = file.difs.iter().collect();
    let mut names: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, d) in decls.iter().enumerate() {
        let n = d.get_ref().name.get_ref().as_str();
        if n == "links" {
            return Err(src.err(
                d.get_ref().name.span(),
                "`links` is reserved for the link shims",
            ));
        }
        if names.insert(n, i).is_some() {
            return Err(src.err(
                d.get_ref().name.span(),
                format!("DIF `{n}` is declared twice"),
            ));
        }
    }
    // Topological order over `over`.
    let mut order: Vec<usize> = Vec::new();
    let mut state = vec![0u8; decls.len()]; // 0 new, 1 visiting, 2 done
    fn visit(
        i: usize,
        decls: &[&Spanned<model::DifDecl>],
        names: &BTreeMap<&str, usize>,
        state: &mut [u8],
        order: &mut Vec<usize>,
        src: &Source<'_>,
    ) -> Result<(), LabError> {
        if state[i] == 2 {
            return Ok(());
        }
        if state[i] == 1 {
            let d = decls[i].get_ref();
            return Err(src.err(
                d.name.span(),
                format!("DIF `{}` is (indirectly) over itself", d.name.get_ref()),
            ));
        }
        state[i] = 1;
        for o in &decls[i].get_ref().over {
            let n = o.get_ref().as_str();
            if n == "links" {
                continue;
            }
            let j = *names.get(n).ok_or_else(|| {
                src.err(
                    o.span(),
                    format!("unknown lower DIF `{n}` (write \"links\" or a declared DIF)"),
                )
            })?;
            visit(j, decls, names, state, order, src)?;
        }
        state[i] = 2;
        order.push(i);
        Ok(())
    }
    for i in 0..decls.len() {
        visit(i, &decls, &names, &mut state, &mut order, src)?;
    }
    let pos_of: BTreeMap<usize, usize> = order.iter().enumerate().map(|(p, &i)| (i, p)).collect();

    let mut difs: Vec<Dif> = Vec::new();
    for &i in &order {
        let sd = decls[i];
        let d = sd.get_ref();
        let name = d.name.get_ref().clone();
        let members = ctx.node_set(&d.members)?;
        if members.len() < 2 {
            return Err(src.err(
                d.name.span(),
                format!("DIF `{name}` needs at least two members"),
            ));
        }
        let mut over = Vec::new();
        let mut adjacencies: Vec<Adjacency> = Vec::new();
        let adjacent = |adj: &[Adjacency], a: usize, b: usize| {
            adj.iter()
                .any(|x| (x.a == a && x.b == b) || (x.a == b && x.b == a))
        };
        for o in &d.over {
            if o.get_ref() == "links" {
                for (li, l) in links.iter().enumerate() {
                    if members.contains(&l.a)
                        && members.contains(&l.b)
                        && !adjacent(&adjacencies, l.a, l.b)
                    {
                        adjacencies.push(Adjacency {
                            a: l.a,
                            b: l.b,
                            over: Over::Link(li),
                        });
                    }
                }
                // Several links between one pair: the first carries the DIF.
                over.push(Lower::Links);
            } else {
                let lower = pos_of[&names[o.get_ref().as_str()]];
                over.push(Lower::Dif(lower));
                let lm = &difs[lower].members;
                match &d.adjacency {
                    Some(pairs) => {
                        for p in pairs {
                            let a = ctx.node(&p[0])?;
                            let b = ctx.node(&p[1])?;
                            for (s, n) in [(&p[0], a), (&p[1], b)] {
                                if !members.contains(&n) {
                                    return Err(src.err(
                                        s.span(),
                                        format!(
                                            "`{}` is not a member of DIF `{name}`",
                                            s.get_ref()
                                        ),
                                    ));
                                }
                            }
                            if lm.contains(&a) && lm.contains(&b) && !adjacent(&adjacencies, a, b) {
                                adjacencies.push(Adjacency {
                                    a,
                                    b,
                                    over: Over::Dif(lower),
                                });
                            }
                        }
                    }
                    None => {
                        for (x, &a) in members.iter().enumerate() {
                            for &b in &members[x + 1..] {
                                if lm.contains(&a)
                                    && lm.contains(&b)
                                    && !adjacent(&adjacencies, a, b)
                                {
                                    adjacencies.push(Adjacency {
                                        a,
                                        b,
                                        over: Over::Dif(lower),
                                    });
                                }
                            }
                        }
                    }
                }
            }
        }
        if let Some(p) = &d.adjacency {
            if p.is_empty() {
                return Err(src.err(d.name.span(), "`adjacency` is empty"));
            }
        }

        // Derived: bootstrap member and enrollment order.
        let degree = |n: usize| adjacencies.iter().filter(|x| x.a == n || x.b == n).count();
        let bootstrap = *members
            .iter()
            .max_by(|&&x, &&y| degree(x).cmp(&degree(y)).then(y.cmp(&x)))
            .expect("two members");
        let mut enrollment_order = vec![bootstrap];
        let mut enrolls_via = BTreeMap::new();
        let mut queue = VecDeque::from([bootstrap]);
        let mut seen = BTreeSet::from([bootstrap]);
        while let Some(n) = queue.pop_front() {
            let mut next: Vec<usize> = adjacencies
                .iter()
                .filter_map(|x| {
                    if x.a == n {
                        Some(x.b)
                    } else if x.b == n {
                        Some(x.a)
                    } else {
                        None
                    }
                })
                .collect();
            next.sort_by_key(|m| members.iter().position(|x| x == m));
            for m in next {
                if seen.insert(m) {
                    enrolls_via.insert(m, n);
                    enrollment_order.push(m);
                    queue.push_back(m);
                }
            }
        }
        if enrollment_order.len() != members.len() {
            let cut: Vec<&str> = members
                .iter()
                .filter(|m| !seen.contains(m))
                .map(|&m| ctx.nodes[m].as_str())
                .collect();
            return Err(src.err(
                d.name.span(),
                format!(
                    "DIF `{name}`: members {} cannot reach `{}`: no link or lower-DIF adjacency joins them",
                    cut.join(", "),
                    ctx.nodes[bootstrap]
                ),
            ));
        }

        // Cubes.
        let mut cubes: Vec<Cube> = Vec::new();
        let decl_cubes: Vec<model::CubeDecl> = if d.cubes.is_empty() {
            default_cubes()
        } else {
            d.cubes.iter().map(|c| c.get_ref().clone()).collect()
        };
        for (k, c) in decl_cubes.iter().enumerate() {
            let cname = c.name.get_ref().clone();
            let id = c.id.unwrap_or(k as u64 + 1);
            if cubes.iter().any(|x| x.name == cname || x.id == id) {
                return Err(src.err(
                    c.name.span(),
                    format!("DIF `{name}`: cube `{cname}` (id {id}) repeats a name or id"),
                ));
            }
            let mut maps_to = BTreeMap::new();
            for (lname, cube) in &c.maps_to {
                let lower = match names.get(lname.as_str()) {
                    Some(&j) if d.over.iter().any(|o| o.get_ref() == lname) => pos_of[&j],
                    _ => {
                        return Err(src.err(
                            cube.span(),
                            format!(
                                "cube `{cname}`: `{lname}` is not a DIF that `{name}` runs over"
                            ),
                        ))
                    }
                };
                let lc = difs[lower]
                    .cubes
                    .iter()
                    .find(|x| &x.name == cube.get_ref())
                    .ok_or_else(|| {
                        src.err(
                            cube.span(),
                            format!(
                                "cube `{cname}` maps to `{}`, which DIF `{lname}` does not have (it has {})",
                                cube.get_ref(),
                                cube_names(&difs[lower])
                            ),
                        )
                    })?;
                maps_to.insert(lower, lc.id);
            }
            for o in &over {
                if let Lower::Dif(lower) = *o {
                    maps_to.entry(lower).or_insert_with(|| {
                        let l = &difs[lower];
                        l.cubes
                            .iter()
                            .find(|x| x.name == cname)
                            .unwrap_or(&l.cubes[0])
                            .id
                    });
                }
            }
            cubes.push(Cube {
                name: cname,
                id,
                urgency: c.urgency,
                cherish: c.cherish,
                reliable: c.reliable,
                maps_to,
                bandwidth_bps: c.bandwidth.map(|r| r.bps()),
                delay: c.delay.map(|x| x.get()),
                loss: c.loss,
                efcp: c.efcp.clone(),
            });
        }
        let scheduler = var
            .and_then(|v| v.scheduler.get(&name).cloned())
            .or_else(|| d.scheduler.clone())
            .unwrap_or_default();
        // The policy must build with this DIF's C/U map.
        let mut cu = rina_core::rmt::CuMap::new();
        for c in &cubes {
            cu = cu.with(c.id, c.urgency, c.cherish);
        }
        if let Err(e) = scheduler.build(&cu) {
            return Err(src.err(d.name.span(), format!("DIF `{name}`: {e}")));
        }
        difs.push(Dif {
            name,
            members,
            over,
            adjacencies,
            scheduler,
            cubes,
            password: d.password.clone(),
            max_pdu: d.max_pdu,
            bootstrap,
            enrollment_order,
            enrolls_via,
        });
    }
    if let Some(v) = var {
        map_all_cubes(&mut difs, v, src)?;
        for dname in v.scheduler.keys() {
            if !difs.iter().any(|d| &d.name == dname) {
                return Err(src.err(
                    v.name.span(),
                    format!("variant `{}`: no DIF `{dname}`", v.name.get_ref()),
                ));
            }
        }
    }
    let dif_of = |s: &Spanned<String>| -> Result<usize, LabError> {
        difs.iter()
            .position(|d| &d.name == s.get_ref())
            .ok_or_else(|| {
                src.err(
                    s.span(),
                    format!(
                        "unknown DIF `{}` (declared: {})",
                        s.get_ref(),
                        difs.iter()
                            .map(|d| d.name.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                )
            })
    };

    // Applications.
    let mut apps: Vec<App> = Vec::new();
    for a in &file.apps {
        let d = a.get_ref();
        let node = ctx.node(&d.node)?;
        let dif = dif_of(&d.dif)?;
        if !difs[dif].has_member(node) {
            return Err(src.err(
                d.node.span(),
                format!(
                    "`{}` is not a member of DIF `{}`",
                    ctx.nodes[node], difs[dif].name
                ),
            ));
        }
        if apps.iter().any(|x| &x.name == d.name.get_ref()) {
            return Err(src.err(
                d.name.span(),
                format!("application `{}` is declared twice", d.name.get_ref()),
            ));
        }
        apps.push(App {
            name: d.name.get_ref().clone(),
            node,
            dif,
            role: d.role,
        });
    }

    // Profiles.
    let mut profiles: BTreeMap<String, (&model::ProfileDecl, Profile)> = BTreeMap::new();
    for p in &file.profiles {
        let d = p.get_ref();
        let prof = d
            .source()
            .profile()
            .map_err(|e| src.err(p.span(), format!("profile `{}`: {e}", d.name.get_ref())))?;
        if profiles
            .insert(d.name.get_ref().clone(), (d, prof))
            .is_some()
        {
            return Err(src.err(
                d.name.span(),
                format!("profile `{}` is declared twice", d.name.get_ref()),
            ));
        }
    }

    // Traffic.
    let duration = file.experiment.duration.get();
    if duration.is_zero() {
        return Err(LabError::At {
            line: 1,
            col: 1,
            msg: "`experiment.duration` must be above zero".into(),
        });
    }
    let mut flows: Vec<Flow> = Vec::new();
    for (ti, t) in file.traffic.iter().enumerate() {
        let d = t.get_ref();
        for v in &d.variants {
            if !file
                .variants
                .iter()
                .any(|x| x.get_ref().name.get_ref() == v)
            {
                return Err(src.err(
                    t.span(),
                    format!("traffic names variant `{v}`, which the file does not declare"),
                ));
            }
        }
        if !d.variants.is_empty() && !variant.is_some_and(|v| d.variants.iter().any(|x| x == v)) {
            continue;
        }
        let over_links = d.dif.get_ref() == "links";
        let dif = if over_links {
            if difs.is_empty() {
                return Err(src.err(
                    d.dif.span(),
                    "traffic over `links` needs at least one normal DIF declared",
                ));
            }
            0
        } else {
            dif_of(&d.dif)?
        };
        let count = d.count.unwrap_or(1);
        if count == 0 || count > 10_000 {
            return Err(src.err(t.span(), "`count` must be between 1 and 10000"));
        }
        let start = d.start.map(|x| x.get()).unwrap_or_default();
        let stop = d.stop.map(|x| x.get()).unwrap_or(duration).min(duration);
        if start >= stop {
            return Err(src.err(t.span(), "traffic starts after it stops"));
        }
        let member = |s: &Spanned<String>, n: usize| -> Result<usize, LabError> {
            if over_links || difs[dif].has_member(n) {
                Ok(n)
            } else {
                Err(src.err(
                    s.span(),
                    format!(
                        "`{}` is not a member of DIF `{}`",
                        s.get_ref(),
                        difs[dif].name
                    ),
                ))
            }
        };
        let cube_id = |s: Option<&Spanned<String>>| -> Result<u64, LabError> {
            match s {
                None => Ok(difs[dif].cubes[0].id),
                Some(s) if over_links => Err(src.err(s.span(), "a link shim has no QoS cubes")),
                Some(s) => difs[dif]
                    .cubes
                    .iter()
                    .find(|c| &c.name == s.get_ref())
                    .map(|c| c.id)
                    .ok_or_else(|| {
                        src.err(
                            s.span(),
                            format!(
                                "DIF `{}` has no cube `{}` (it has {})",
                                difs[dif].name,
                                s.get_ref(),
                                cube_names(&difs[dif])
                            ),
                        )
                    }),
            }
        };
        // Endpoints.
        let mut ends: Vec<(usize, Dest)> = Vec::new();
        for p in &d.pairs {
            let a = member(&p[0], ctx.node(&p[0])?)?;
            let b = member(&p[1], ctx.node(&p[1])?)?;
            ends.push((a, Dest::Node(b)));
        }
        if !d.from.is_empty() {
            let dest = match (&d.to, &d.app) {
                (Some(to), None) => Dest::Node(member(to, ctx.node(to)?)?),
                (None, Some(app)) => {
                    let ai = apps
                        .iter()
                        .position(|x| &x.name == app.get_ref())
                        .ok_or_else(|| {
                            src.err(
                                app.span(),
                                format!("unknown application `{}` (not in [[app]])", app.get_ref()),
                            )
                        })?;
                    if apps[ai].dif != dif {
                        return Err(src.err(
                            app.span(),
                            format!(
                                "application `{}` is registered in DIF `{}`, not `{}`",
                                app.get_ref(),
                                difs[apps[ai].dif].name,
                                difs[dif].name
                            ),
                        ));
                    }
                    Dest::App(ai)
                }
                _ => {
                    return Err(src.err(
                        t.span(),
                        "with `from`, give exactly one of `to` (a node) and `app`",
                    ))
                }
            };
            for s in &d.from {
                for n in ctx.node_set(std::slice::from_ref(s))? {
                    if !difs[dif].has_member(n) {
                        if s.get_ref().starts_with('@') || s.get_ref() == "*" {
                            continue; // groups select the members among them
                        }
                        member(s, n)?;
                    }
                    if Dest::Node(n) != dest && !matches!(dest, Dest::App(a) if apps[a].node == n) {
                        ends.push((n, dest));
                    }
                }
            }
        }
        if ends.is_empty() {
            return Err(src.err(
                t.span(),
                "traffic has no endpoints: give `pairs`, or `from` with `to` or `app`",
            ));
        }
        let mut shims: Vec<Option<usize>> = Vec::new();
        for &(a, b) in &ends {
            if !over_links {
                shims.push(None);
                continue;
            }
            let bn = match b {
                Dest::Node(n) => n,
                Dest::App(x) => apps[x].node,
            };
            let l = links
                .iter()
                .position(|l| (l.a == a && l.b == bn) || (l.a == bn && l.b == a))
                .ok_or_else(|| {
                    src.err(
                        t.span(),
                        format!(
                            "`{}` and `{}` share no link, so no link shim joins them",
                            ctx.nodes[a], ctx.nodes[bn]
                        ),
                    )
                })?;
            shims.push(Some(l));
        }
        let shim_of = |a: usize, b: Dest| {
            ends.iter()
                .position(|e| *e == (a, b))
                .and_then(|i| shims[i])
        };
        let dest_name = |x: Dest| match x {
            Dest::Node(n) => ctx.nodes[n].clone(),
            Dest::App(a) => apps[a].name.clone(),
        };
        match d.kind {
            TrafficKind::Tgen => {
                if d.profiles.is_empty() {
                    return Err(src.err(t.span(), "tgen traffic needs `profiles`"));
                }
                for pname in &d.profiles {
                    let (pd, prof) = profiles.get(pname.get_ref()).ok_or_else(|| {
                        src.err(
                            pname.span(),
                            format!("unknown profile `{}` (not in [[profile]])", pname.get_ref()),
                        )
                    })?;
                    let cube = cube_id(pd.cube.as_ref())?;
                    for &(a, b) in &ends {
                        let mut dirs = vec![(a, b)];
                        if d.bidirectional {
                            match b {
                                Dest::Node(bn) => dirs.push((bn, Dest::Node(a))),
                                Dest::App(_) => {
                                    return Err(src.err(
                                        t.span(),
                                        "`bidirectional` needs node endpoints, not `app`",
                                    ))
                                }
                            }
                        }
                        let shim = shim_of(a, b);
                        for (x, y) in dirs {
                            for k in 0..count {
                                flows.push(Flow {
                                    id: suffix(
                                        format!(
                                            "t{ti}.{}.{}>{}",
                                            pname.get_ref(),
                                            ctx.nodes[x],
                                            dest_name(y)
                                        ),
                                        k,
                                        count,
                                    ),
                                    kind: d.kind,
                                    dif,
                                    shim,
                                    class: pname.get_ref().clone(),
                                    cube,
                                    from: x,
                                    to: y,
                                    profile: Some(prof.clone()),
                                    interval: Duration::ZERO,
                                    size: 0,
                                    sdu_sizes: Vec::new(),
                                    per_size: Duration::ZERO,
                                    start,
                                    stop,
                                });
                            }
                        }
                    }
                }
            }
            TrafficKind::Echo | TrafficKind::Perf => {
                let cube = cube_id(d.cube.as_ref())?;
                let class = d.class.clone().unwrap_or_else(|| match d.kind {
                    TrafficKind::Echo => "echo".into(),
                    _ => "perf".into(),
                });
                if d.kind == TrafficKind::Perf && d.sdu_sizes.is_empty() {
                    return Err(src.err(t.span(), "perf traffic needs `sdu_sizes`"));
                }
                if d.sdu_sizes.iter().any(|&s| s == 0 || s > 1 << 20) {
                    return Err(src.err(t.span(), "`sdu_sizes` must be between 1 byte and 1 MiB"));
                }
                let interval = d
                    .interval
                    .map(|x| x.get())
                    .unwrap_or(Duration::from_millis(100));
                if interval.is_zero() {
                    return Err(src.err(t.span(), "`interval` must be above zero"));
                }
                for &(a, b) in &ends {
                    for k in 0..count {
                        flows.push(Flow {
                            id: suffix(
                                format!("t{ti}.{class}.{}>{}", ctx.nodes[a], dest_name(b)),
                                k,
                                count,
                            ),
                            kind: d.kind,
                            dif,
                            shim: shim_of(a, b),
                            class: class.clone(),
                            cube,
                            from: a,
                            to: b,
                            profile: None,
                            interval,
                            size: d.size.unwrap_or(64),
                            sdu_sizes: d.sdu_sizes.clone(),
                            per_size: d
                                .per_size
                                .map(|x| x.get())
                                .unwrap_or(Duration::from_secs(2)),
                            start,
                            stop,
                        });
                    }
                }
            }
        }
    }

    // Events.
    let mut events: Vec<Event> = Vec::new();
    for e in &file.events {
        let d = e.get_ref();
        let need = |o: &Option<Spanned<String>>, what: &str| -> Result<Spanned<String>, LabError> {
            o.clone()
                .ok_or_else(|| src.err(e.span(), format!("this event needs `{what}`")))
        };
        let link = |s: &Spanned<String>| {
            links
                .iter()
                .position(|l| &l.name == s.get_ref())
                .ok_or_else(|| src.err(s.span(), format!("unknown link `{}`", s.get_ref())))
        };
        let what = match d.action {
            EventAction::LinkDown => EventKind::LinkDown(link(&need(&d.link, "link")?)?),
            EventAction::LinkUp => EventKind::LinkUp(link(&need(&d.link, "link")?)?),
            EventAction::NodeStop => EventKind::NodeStop(ctx.node(&need(&d.node, "node")?)?),
            EventAction::NodeStart => EventKind::NodeStart(ctx.node(&need(&d.node, "node")?)?),
            EventAction::AppMove => {
                let a = need(&d.app, "app")?;
                let ai = apps
                    .iter()
                    .position(|x| &x.name == a.get_ref())
                    .ok_or_else(|| {
                        src.err(a.span(), format!("unknown application `{}`", a.get_ref()))
                    })?;
                let to = need(&d.to, "to")?;
                let tn = ctx.node(&to)?;
                if !difs[apps[ai].dif].has_member(tn) {
                    return Err(src.err(
                        to.span(),
                        format!(
                            "`{}` is not a member of DIF `{}`",
                            to.get_ref(),
                            difs[apps[ai].dif].name
                        ),
                    ));
                }
                EventKind::AppMove { app: ai, to: tn }
            }
        };
        if d.at.get() > duration {
            return Err(src.err(e.span(), "event after the end of the experiment"));
        }
        events.push(Event {
            at: d.at.get(),
            what,
        });
    }
    events.sort_by_key(|e| e.at);

    // Load.
    let load = match &file.load {
        None => None,
        Some(l) => {
            let d = l.get_ref();
            let target = var.and_then(|v| v.load).unwrap_or(d.target);
            if !(target > 0.0 && target < 1.0) {
                return Err(src.err(
                    l.span(),
                    format!("load target {target} is not between 0 and 1"),
                ));
            }
            let mut sel = Vec::new();
            for s in &d.links {
                let hit = select_links(&links, s.get_ref());
                if hit.is_empty() {
                    return Err(
                        src.err(s.span(), format!("no link or link group `{}`", s.get_ref()))
                    );
                }
                sel.extend(hit);
            }
            sel.sort_unstable();
            sel.dedup();
            for w in &d.without {
                let known = file
                    .profiles
                    .iter()
                    .any(|p| p.get_ref().name.get_ref() == w.get_ref())
                    || flows.iter().any(|f| &f.class == w.get_ref());
                if !known {
                    return Err(src.err(w.span(), format!("no traffic class `{}`", w.get_ref())));
                }
            }
            Some(Load {
                target,
                links: sel,
                duration: d.duration.map(|x| x.get()).unwrap_or(duration),
                without: d.without.iter().map(|w| w.get_ref().clone()).collect(),
            })
        }
    };

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

/// A variant's `maps_to`: every cube of the named DIF rides on the one
/// named cube of each named lower DIF.
fn map_all_cubes(difs: &mut [Dif], v: &model::VariantDecl, src: &Source) -> Result<(), LabError> {
    let vname = v.name.get_ref();
    for (dname, lowers) in &v.maps_to {
        let err = |what: String| src.err(v.name.span(), format!("variant `{vname}`: {what}"));
        let d = difs
            .iter()
            .position(|d| &d.name == dname)
            .ok_or_else(|| err(format!("no DIF `{dname}`")))?;
        for (lname, cube) in lowers {
            let l = difs
                .iter()
                .position(|x| &x.name == lname)
                .filter(|&l| difs[d].over.contains(&Lower::Dif(l)))
                .ok_or_else(|| err(format!("`{lname}` is not a DIF that `{dname}` runs over")))?;
            let id = difs[l]
                .cubes
                .iter()
                .find(|c| &c.name == cube)
                .map(|c| c.id)
                .ok_or_else(|| err(format!("DIF `{lname}` has no cube `{cube}`")))?;
            for c in &mut difs[d].cubes {
                c.maps_to.insert(l, id);
            }
        }
    }
    Ok(())
}

fn suffix(id: String, k: usize, count: usize) -> String {
    if count == 1 {
        id
    } else {
        format!("{id}.{k}")
    }
}

/// Links selected by name, or by `@group` / group name.
fn select_links(links: &[Link], sel: &str) -> Vec<usize> {
    let g = sel.strip_prefix('@').unwrap_or(sel);
    links
        .iter()
        .enumerate()
        .filter(|(_, l)| l.name == sel || l.groups.iter().any(|x| x == g))
        .map(|(i, _)| i)
        .collect()
}

fn cube_names(d: &Dif) -> String {
    d.cubes
        .iter()
        .map(|c| format!("`{}`", c.name))
        .collect::<Vec<_>>()
        .join(", ")
}

fn default_cubes() -> Vec<model::CubeDecl> {
    let c = |name: &str, reliable: bool| model::CubeDecl {
        name: Spanned::new(0..0, name.to_string()),
        id: None,
        urgency: 0,
        cherish: 0,
        reliable,
        maps_to: BTreeMap::new(),
        bandwidth: None,
        delay: None,
        loss: None,
        efcp: Default::default(),
    };
    vec![c("best-effort", false), c("reliable", true)]
}
