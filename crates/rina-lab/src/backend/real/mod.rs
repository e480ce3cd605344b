//! What the `local`, `netns` and `ssh` backends share: `rinad` configurations
//! ([`config`]), process supervision ([`Procs`]), the UDP link emulator
//! ([`relay`]) and the run itself ([`run`]): start one `rinad` per node,
//! wait until every normal IPCP has enrolled, start the servers, run the
//! real tools (`rina-echo`, `rina-tgen`, `rina-perf`) at their times,
//! apply the events, and turn the tools' JSON into [`RunOutput`].
//!
//! The backends differ only in how links are made and where programs run
//! ([`Fabric`]).
//!
//! # Binaries
//!
//! `rinad` and the tools are looked up in `$RINA_LAB_BIN` (a folder), else
//! next to the running executable (and one folder up, for test binaries in
//! `target/<profile>/deps`); `$RINAD` overrides `rinad` alone. Build them
//! with `cargo build -p rinad -p rina-tools`.
//!
//! # Flows
//!
//! A flow to an application that moves during it is run as one client per
//! place the application is at (`<flow>`, `<flow>#2`, ...; `served_by` the
//! node it was at). Each client's JSON report (stdout) and stderr are kept
//! in `out/` of the run's folder; `logs/<node>.log` holds each `rinad`'s log.

pub mod config;
mod launch;
mod matrix;
pub mod relay;
mod traffic_run;

use crate::backend::RunCtx;
use crate::model::TrafficKind;
use crate::resolve::{Dest, EventKind, Flow};
use crate::results::{
    stats_ms, FlowRecord, GoodputPoint, LinkRecord, Reservoir, RunOutput, TimelineEntry,
};
use crate::{Experiment, LabError};
use launch::Launcher;
use rina_tools::tgen::gen::Profile;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// Longest a `rina-tgen` client waits for its server's REPORT after its
/// last SDU, in the original's seconds (dilated like every time). The FIN
/// that asks for it travels behind what the flow's queues still hold —
/// seed 004's R-lim queue of 1000 PDUs for cube B1 takes ~6 s to drain at
/// 1/10 of the paper's rate, and with 2 s every B1 video flow of a 30 s
/// run lost its report — and the wait ends as soon as the REPORT comes,
/// so a long one costs time only where a report is lost.
pub const REPORT_WAIT_S: f64 = 10.0;

pub use config::ShimKind;

/// How a backend makes links and runs programs in a node.
pub trait Fabric {
    /// `local`, `netns` or `ssh`.
    fn name(&self) -> &'static str;
    /// Makes the links (before any `rinad` starts).
    fn setup(&mut self, exp: &Experiment, dir: &Path) -> Result<(), LabError>;
    /// The shim of link `link` at `node`.
    fn shim(&self, node: usize, link: usize) -> ShimKind;
    /// A command running `program` inside `node`.
    fn command(&self, node: usize, program: &Path) -> Command;
    /// Traffic starts: turn the links' random loss on (links are lossless
    /// while the DIFs enroll).
    fn traffic_starts(&self);
    /// Takes link `link` down or up.
    fn set_link(&self, link: usize, up: bool) -> Result<(), LabError>;
    /// Bytes sent A to B, B to A, and frames dropped on `link` so far.
    fn link_counters(&self, link: usize) -> (u64, u64, u64);
    /// Removes what [`Fabric::setup`] made (also done on drop).
    fn teardown(&mut self);
    /// A command running the tool `program` (`rinactl`, a traffic tool)
    /// for `node`: by default here, reaching the node's `rinad` by the
    /// path of its socket.
    fn tool_command(&self, _node: usize, program: &Path) -> Command {
        Command::new(program)
    }
    /// Where `node`'s control socket is, if not in a local temporary
    /// folder (the default, `None`).
    fn socket(&self, _node: usize) -> Option<PathBuf> {
        None
    }
    /// Puts `node`'s configuration, written at `local`, where its `rinad`
    /// reads it; returns that path (by default `local` itself).
    fn place_config(&mut self, _node: usize, local: &Path) -> Result<PathBuf, LabError> {
        Ok(local.to_path_buf())
    }
    /// Lines for the run's timeline about how the links were made (clock
    /// offsets of remote hosts, ...); none by default.
    fn notes(&self) -> Vec<String> {
        Vec::new()
    }
    /// Traffic has ended and the daemons still run: collect what is to be
    /// collected from them (nothing by default).
    fn traffic_ended(&mut self) {}
}

/// Where the binaries are.
#[derive(Debug, Clone)]
pub struct Bins {
    /// `rinad`.
    pub rinad: PathBuf,
    /// Folder of `rina-echo`, `rina-tgen`, `rina-perf`, `rinactl`.
    pub tools: PathBuf,
}

impl Bins {
    /// Finds the binaries (see the module documentation).
    pub fn find(backend: &'static str) -> Result<Bins, LabError> {
        let mut dirs: Vec<PathBuf> = Vec::new();
        if let Some(d) = std::env::var_os("RINA_LAB_BIN") {
            dirs.push(d.into());
        }
        if let Ok(exe) = std::env::current_exe() {
            if let Some(p) = exe.parent() {
                dirs.push(p.to_path_buf());
                if let Some(pp) = p.parent() {
                    dirs.push(pp.to_path_buf());
                }
            }
        }
        let tools = dirs
            .iter()
            .find(|d| d.join("rina-echo").is_file() && d.join("rina-tgen").is_file())
            .cloned();
        let rinad = std::env::var_os("RINAD")
            .map(PathBuf::from)
            .or_else(|| dirs.iter().map(|d| d.join("rinad")).find(|p| p.is_file()));
        match (rinad, tools) {
            (Some(rinad), Some(tools)) => Ok(Bins { rinad, tools }),
            _ => Err(LabError::Unsupported {
                backend,
                reason: format!(
                    "rinad and the tools (rina-echo, rina-tgen, rina-perf, rinactl) not found in {} \
                     (build them with `cargo build -p rinad -p rina-tools`, or set RINA_LAB_BIN)",
                    dirs.iter()
                        .map(|d| d.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            }),
        }
    }

    fn tool(&self, name: &str) -> PathBuf {
        self.tools.join(name)
    }
}

/// Started processes; every one still running is killed on drop.
#[derive(Default)]
pub struct Procs {
    list: Vec<(String, Child)>,
}

impl Procs {
    /// Keeps `child` under `name`.
    pub fn add(&mut self, name: String, child: Child) {
        self.list.push((name, child));
    }

    /// Kills the processes called `name`.
    pub fn kill(&mut self, name: &str) {
        for (n, c) in self.list.iter_mut() {
            if n == name {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        self.list.retain(|(n, _)| n != name);
    }

    /// Whether the process called `name` still runs (and its exit status).
    pub fn status(&mut self, name: &str) -> Option<Option<std::process::ExitStatus>> {
        self.list
            .iter_mut()
            .find(|(n, _)| n == name)
            .map(|(_, c)| c.try_wait().ok().flatten())
    }

    /// Kills everything.
    pub fn kill_all(&mut self) {
        for (_, c) in self.list.iter_mut() {
            let _ = c.kill();
        }
        for (_, c) in self.list.iter_mut() {
            let _ = c.wait();
        }
        self.list.clear();
    }
}

impl Drop for Procs {
    fn drop(&mut self) {
        self.kill_all();
    }
}

/// A folder removed on drop (sockets: their paths must stay short).
struct TempDir(PathBuf);

impl TempDir {
    /// Makes a fresh folder for the nodes' control sockets in the system's
    /// temporary folder (`wall`: when the run began, to tell runs apart).
    fn for_sockets(wall: Instant) -> Result<TempDir, LabError> {
        let sock_dir = TempDir(std::env::temp_dir().join(format!(
            "rina-lab-{}-{}",
            std::process::id(),
            wall.elapsed().as_nanos() ^ (std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.subsec_nanos() as u128)
                .unwrap_or(0))
        )));
        std::fs::create_dir_all(&sock_dir.0).map_err(|e| LabError::io(&sock_dir.0, e))?;
        Ok(sock_dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Tears the fabric's links down on drop, however the run ends.
struct Teardown<'a>(&'a mut dyn Fabric);

impl Drop for Teardown<'_> {
    fn drop(&mut self) {
        self.0.teardown();
    }
}

/// The run's folders: `logs/` (daemons, servers), `out/` (clients' reports
/// and stderr) and `conf/` (configurations, traffic matrices).
struct RunDirs {
    logs: PathBuf,
    outs: PathBuf,
    confs: PathBuf,
}

impl RunDirs {
    /// Makes the run's folders in `dir`.
    fn create(dir: &Path) -> Result<RunDirs, LabError> {
        let logs = dir.join("logs");
        let outs = dir.join("out");
        let confs = dir.join("conf");
        for d in [&logs, &outs, &confs] {
            std::fs::create_dir_all(d).map_err(|e| LabError::io(d, e))?;
        }
        Ok(RunDirs { logs, outs, confs })
    }
}

/// A client to run: one flow, or one part of it around application moves.
#[derive(Debug, Clone)]
struct Job {
    /// Index into the experiment's flows.
    flow: usize,
    /// Record id.
    id: String,
    start: Duration,
    stop: Duration,
    /// The node serving it.
    served_by: usize,
    /// Server name to allocate to.
    dst: String,
    /// DIF to allocate in.
    dif: String,
    /// Process name.
    proc: String,
    started: bool,
    /// When to start (again): a client whose allocation fails (the
    /// directory has not yet learnt where a moved application went) is
    /// retried every 200 ms until its stop time.
    attempt_at: Duration,
    /// Allocation attempts that failed.
    failed: u32,
    /// Run by its node's one `rina-tgen` ([`matrix`]): the group (index)
    /// and the flow's number in its matrix.
    group: Option<(usize, u32)>,
}

/// A server: tool, name, DIF, node.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Server {
    kind: TrafficKind,
    name: String,
    dif: String,
    node: usize,
    /// The application (index) it stands for, if any.
    app: Option<usize>,
}

impl Server {
    /// The name its process is kept under in [`Procs`].
    fn proc_name(&self) -> String {
        format!("server {} {} {}", self.name, self.dif, self.node)
    }
}

/// What a run starts: the servers, the clients, the groups of clients one
/// `rina-tgen` runs, and the names each node reaches over each link shim.
struct RunPlan {
    servers: Vec<Server>,
    jobs: Vec<Job>,
    groups: Vec<matrix::Group>,
    /// Per node: for shim-udp directories.
    shim_apps: Vec<config::ShimApps>,
}

impl RunPlan {
    /// Plans the run of `exp` (see [`plan`] and [`matrix::groups`]).
    fn new(exp: &Experiment) -> Result<RunPlan, String> {
        let (servers, mut jobs) = plan(exp)?;
        let groups = matrix::groups(exp, &jobs);
        for (gi, g) in groups.iter().enumerate() {
            for (n, &k) in g.jobs.iter().enumerate() {
                jobs[k].proc = g.proc.clone();
                jobs[k].group = Some((gi, n as u32 + 1));
            }
        }
        // Names reached over each link shim, per node: for shim-udp directories.
        let mut shim_apps: Vec<config::ShimApps> = vec![BTreeMap::new(); exp.nodes.len()];
        for f in &exp.flows {
            if let Some(l) = f.shim {
                shim_apps[f.from]
                    .entry(l)
                    .or_default()
                    .push(server_name(exp, f.kind, f.to));
            }
        }
        Ok(RunPlan {
            servers,
            jobs,
            groups,
            shim_apps,
        })
    }
}

fn err(backend: &'static str, what: impl Into<String>) -> LabError {
    LabError::Backend {
        backend,
        what: what.into(),
    }
}

fn kind_tool(k: TrafficKind) -> &'static str {
    match k {
        TrafficKind::Echo => "rina-echo",
        TrafficKind::Tgen => "rina-tgen",
        TrafficKind::Perf => "rina-perf",
    }
}

fn kind_name(k: TrafficKind) -> &'static str {
    match k {
        TrafficKind::Echo => "echo",
        TrafficKind::Tgen => "tgen",
        TrafficKind::Perf => "perf",
    }
}

/// The DIF a flow allocates in (a link's shim DIF or a normal DIF).
fn flow_dif(exp: &Experiment, f: &Flow) -> String {
    match f.shim {
        Some(l) => exp.links[l].name.clone(),
        None => exp.difs[f.dif].name.clone(),
    }
}

/// Server name for flows of `kind` to `dest` in `dif`.
fn server_name(exp: &Experiment, kind: TrafficKind, dest: Dest) -> String {
    match dest {
        Dest::App(a) => exp.apps[a].name.clone(),
        Dest::Node(n) => format!("{}.{}", kind_name(kind), exp.nodes[n]),
    }
}

/// Runs `exp` on `fabric`.
pub fn run(
    exp: &Experiment,
    ctx: &RunCtx<'_>,
    fabric: &mut dyn Fabric,
) -> Result<RunOutput, LabError> {
    let be = fabric.name();
    let wall = Instant::now();
    let bins = Bins::find(be)?;
    let dirs = RunDirs::create(ctx.dir)?;
    let sock_dir = TempDir::for_sockets(wall)?;
    let mut timeline: Vec<TimelineEntry> = Vec::new();
    let mut procs = Procs::default();
    let mut plan = RunPlan::new(exp).map_err(|e| err(be, e))?;

    (ctx.progress)(0.0, "setting up links");
    fabric.setup(exp, ctx.dir)?;
    let fab = Teardown(fabric);
    for what in fab.0.notes() {
        timeline.push(TimelineEntry { t_s: 0.0, what });
    }

    // Configurations and daemons.
    let launch = Launcher::configure(be, exp, &mut *fab.0, &bins, &dirs, &sock_dir.0, &plan)?;
    (ctx.progress)(0.02, "starting rinad");
    for n in launch::start_order(exp) {
        launch.start_rinad(&mut procs, n)?;
    }

    // Wait for every normal IPCP to have an address.
    let setup_t0 = Instant::now();
    let enrolled = |n: usize| launch.enrolled(n);
    wait_enrolled(be, exp, ctx, &mut procs, &dirs.logs, setup_t0, &enrolled)?;
    let enrolled_after = setup_t0.elapsed();

    // Servers, and time for their registrations to spread.
    launch.start_initial_servers(&mut procs, &plan.servers)?;
    settle(exp, ctx)?;
    timeline.push(setup_entry(exp, setup_t0, enrolled_after));

    // Traffic.
    let links = traffic_run::run_traffic(&launch, ctx, &mut plan, &mut procs, &mut timeline)?;
    fab.0.traffic_ended();
    procs.kill_all();
    drop(fab);

    let mut out = results(be, exp, &plan, &dirs.outs, &links);
    timeline.sort_by(|a, b| a.t_s.total_cmp(&b.t_s));
    out.timeline = timeline;
    out.wall_time_s = wall.elapsed().as_secs_f64();
    (ctx.progress)(1.0, "done");
    drop(sock_dir);
    Ok(out)
}

/// The timeline's line on the daemons: started at `setup_t0` (before
/// traffic, which starts now), all enrolled `enrolled_after` it.
fn setup_entry(exp: &Experiment, setup_t0: Instant, enrolled_after: Duration) -> TimelineEntry {
    TimelineEntry {
        t_s: -(setup_t0.elapsed().as_secs_f64()),
        what: format!(
            "{} rinad started; all enrolled after {:.2} s",
            exp.nodes.len(),
            enrolled_after.as_secs_f64()
        ),
    }
}

/// Gives registrations and routes time to spread: waits the experiment's
/// warm-up (1.5 s by default), or until the run must stop.
fn settle(exp: &Experiment, ctx: &RunCtx<'_>) -> Result<(), LabError> {
    let settle = exp.warmup.unwrap_or(Duration::from_millis(1500));
    let settle_end = Instant::now() + settle;
    while Instant::now() < settle_end {
        if ctx.stopped() {
            return Err(LabError::Interrupted);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// Waits until every node's normal IPCPs have an address (`enrolled(n)`:
/// how many of node `n`'s have one), failing if a `rinad` exits or the
/// time allowed passes.
fn wait_enrolled(
    be: &'static str,
    exp: &Experiment,
    ctx: &RunCtx<'_>,
    procs: &mut Procs,
    logs: &Path,
    setup_t0: Instant,
    enrolled: &dyn Fn(usize) -> usize,
) -> Result<(), LabError> {
    let deadline = setup_t0 + Duration::from_secs(20 + 2 * exp.nodes.len() as u64);
    let want: Vec<usize> = (0..exp.nodes.len())
        .map(|n| exp.difs.iter().filter(|d| d.has_member(n)).count())
        .collect();
    let mut ready = vec![false; exp.nodes.len()];
    loop {
        if ctx.stopped() {
            return Err(LabError::Interrupted);
        }
        for n in 0..exp.nodes.len() {
            if !ready[n] {
                if let Some(Some(st)) = procs.status(&format!("rinad {n}")) {
                    return Err(err(
                        be,
                        format!(
                            "rinad of {} exited ({st}); see {}",
                            exp.nodes[n],
                            logs.join(format!("{}.log", exp.nodes[n])).display()
                        ),
                    ));
                }
                ready[n] = enrolled(n) >= want[n];
            }
        }
        let done = ready.iter().filter(|r| **r).count();
        (ctx.progress)(
            0.02 + 0.08 * done as f64 / exp.nodes.len() as f64,
            &format!("enrolling: {done}/{} nodes", exp.nodes.len()),
        );
        if done == exp.nodes.len() {
            return Ok(());
        }
        if Instant::now() > deadline {
            let missing: Vec<&str> = (0..exp.nodes.len())
                .filter(|&n| !ready[n])
                .map(|n| exp.nodes[n].as_str())
                .collect();
            return Err(err(
                be,
                format!(
                    "not enrolled after {:?}: {} (logs in {})",
                    deadline - setup_t0,
                    missing.join(", "),
                    logs.display()
                ),
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The run's figures from the tools' reports in `outs` and the links'
/// counters at the start and the end of traffic.
fn results(
    be: &str,
    exp: &Experiment,
    plan: &RunPlan,
    outs: &Path,
    links: &traffic_run::LinkCounters,
) -> RunOutput {
    let (jobs, groups) = (&plan.jobs, &plan.groups);
    let (link_base, link_end) = (&links.base, &links.end);
    let mut out = RunOutput {
        backend: be.into(),
        experiment: exp.name.clone(),
        variant: exp.variant.clone(),
        duration_s: exp.duration.as_secs_f64(),
        ..Default::default()
    };
    let mut res = Reservoir::new(20_000, exp.seed);
    for j in jobs {
        let f = &exp.flows[j.flow];
        let stem = match j.group {
            Some((g, _)) => matrix::stem(exp, &groups[g]),
            None => safe(&j.id),
        };
        let text = std::fs::read_to_string(outs.join(format!("{stem}.json"))).unwrap_or_default();
        let errtext = std::fs::read_to_string(outs.join(format!("{stem}.err"))).unwrap_or_default();
        let mut rec = FlowRecord {
            flow: j.id.clone(),
            kind: kind_name(f.kind).into(),
            class: f.class.clone(),
            dif: j.dif.clone(),
            cube: cube_name(exp, f),
            src: exp.nodes[f.from].clone(),
            dst: match f.to {
                Dest::Node(n) => exp.nodes[n].clone(),
                Dest::App(a) => exp.apps[a].name.clone(),
            },
            served_by: Some(exp.nodes[j.served_by].clone()),
            hops: match f.shim {
                Some(_) => Some(1),
                None => config::hops(exp, f.dif, f.from, j.served_by),
            },
            ..Default::default()
        };
        let active = (j.stop.saturating_sub(j.start)).as_secs_f64().max(1e-3);
        let parsed = match f.kind {
            TrafficKind::Echo => parse_echo(&text, &mut rec, &mut res, active),
            TrafficKind::Tgen => {
                parse_tgen(&text, j.group.map(|g| g.1), &mut rec, &mut res, active)
            }
            TrafficKind::Perf => parse_perf(&text, &mut rec, &mut out.goodput),
        };
        if let Err(e) = parsed {
            let last = errtext
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("")
                .trim();
            rec.error = Some(if last.is_empty() {
                e
            } else {
                format!("{e}: {last}")
            });
        }
        out.flows.push(rec);
    }
    out.samples = res.into_samples();
    let span = exp.duration.as_secs_f64().max(1e-3);
    for (l, link) in exp.links.iter().enumerate() {
        let (a0, b0, d0) = link_base[l];
        let (a1, b1, d1) = link_end[l];
        out.links.push(LinkRecord {
            link: link.name.clone(),
            rate_bps: link.rate_bps,
            avg_bps_ab: a1.saturating_sub(a0) as f64 * 8.0 / span,
            avg_bps_ba: b1.saturating_sub(b0) as f64 * 8.0 / span,
            dropped: d1.saturating_sub(d0),
        });
    }
    out
}

/// The servers to start and the clients to run: one client per flow, or
/// one per part of a flow around its destination's moves.
fn plan(exp: &Experiment) -> Result<(Vec<Server>, Vec<Job>), String> {
    let mut servers: Vec<Server> = Vec::new();
    let mut jobs: Vec<Job> = Vec::new();
    for (fi, f) in exp.flows.iter().enumerate() {
        let dif = flow_dif(exp, f);
        let name = server_name(exp, f.kind, f.to);
        // Where the destination is over time.
        let mut places: Vec<(Duration, usize)> = vec![(Duration::ZERO, exp.dest_node(f.to))];
        if let Dest::App(a) = f.to {
            for e in &exp.events {
                if let EventKind::AppMove { app, to } = e.what {
                    if app == a {
                        places.push((e.at, to));
                    }
                }
            }
        }
        for &(_, node) in &places {
            let s = Server {
                kind: f.kind,
                name: name.clone(),
                dif: dif.clone(),
                node,
                app: match f.to {
                    Dest::App(a) => Some(a),
                    Dest::Node(_) => None,
                },
            };
            if let Some(o) = servers
                .iter()
                .find(|o| o.name == s.name && o.dif == s.dif && o.kind != s.kind)
            {
                return Err(format!(
                    "application `{}` receives both {} and {} traffic; this backend runs one tool per application",
                    s.name,
                    kind_name(o.kind),
                    kind_name(s.kind)
                ));
            }
            if !servers.contains(&s) {
                servers.push(s);
            }
        }
        // Split the flow at the moves that happen during it.
        let end = match f.kind {
            TrafficKind::Perf => f.start + f.per_size * f.sdu_sizes.len() as u32,
            _ => f.stop,
        };
        let mut part = 0;
        for (i, &(at, node)) in places.iter().enumerate() {
            let from = at.max(f.start);
            let to = places.get(i + 1).map(|p| p.0).unwrap_or(end).min(end);
            if to <= from && !(i == places.len() - 1 && part == 0) {
                continue;
            }
            part += 1;
            let id = if part == 1 {
                f.id.clone()
            } else {
                format!("{}#{part}", f.id)
            };
            jobs.push(Job {
                flow: fi,
                proc: format!("client {id}"),
                id,
                start: from,
                stop: to.max(from),
                served_by: node,
                dst: name.clone(),
                dif: dif.clone(),
                started: false,
                attempt_at: from,
                failed: 0,
                group: None,
            });
        }
    }
    Ok((servers, jobs))
}

fn safe(id: &str) -> String {
    id.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.#".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect()
}

fn out_file(dir: &Path, id: &str, ext: &str) -> Result<std::fs::File, LabError> {
    let p = dir.join(format!("{}.{ext}", safe(id)));
    std::fs::File::create(&p).map_err(|e| LabError::io(&p, e))
}

fn cube_name(exp: &Experiment, f: &Flow) -> String {
    if f.shim.is_some() {
        return String::new();
    }
    exp.difs[f.dif]
        .cube(f.cube)
        .map(|c| c.name.clone())
        .unwrap_or_default()
}

/// The command line of a job's client.
fn client_command(
    mut c: Command,
    sock: &Path,
    f: &Flow,
    j: &Job,
    now: Duration,
    exp: &Experiment,
) -> Command {
    let (seed, dilation) = (exp.seed, exp.dilation.unwrap_or(1.0));
    c.arg("client")
        .arg("--socket")
        .arg(sock)
        .arg("--dif")
        .arg(&j.dif)
        .arg("--dst")
        .arg(&j.dst)
        .arg("--name")
        .arg(format!("{}-c{}", kind_name(f.kind), j.flow))
        .arg("--json");
    if f.shim.is_none() && f.cube != 0 {
        c.arg("--qos-cube").arg(f.cube.to_string());
    }
    let len = j.stop.saturating_sub(j.start.max(now));
    match f.kind {
        TrafficKind::Echo => {
            let iv = f.interval.as_millis().max(1);
            let count = ((len.as_millis() / iv) as u64).max(1);
            c.arg("--count")
                .arg(count.to_string())
                .arg("--interval-ms")
                .arg(iv.to_string())
                .arg("--size")
                .arg(f.size.max(16).to_string())
                .arg("--timeout-ms")
                // A reply later than this is lost: 1 s at the paper's 100 ms
                // probes, dilated with them.
                .arg((iv * 10).max(1000).to_string());
        }
        TrafficKind::Tgen => {
            if let Some(p) = &f.profile {
                profile_args(&mut c, p);
            }
            c.arg("--duration-s")
                .arg(format!("{:.3}", len.as_secs_f64().max(0.05)))
                .arg("--report-wait-s")
                .arg(format!("{:.1}", REPORT_WAIT_S / dilation))
                .arg("--direction")
                .arg("forward")
                .arg("--seed")
                .arg(flow_seed(seed, j.flow).to_string())
                .arg("--interval-s")
                .arg("0");
        }
        TrafficKind::Perf => {
            let sizes: Vec<String> = f.sdu_sizes.iter().map(|s| s.max(&17).to_string()).collect();
            c.arg("--sweep")
                .arg(sizes.join(","))
                .arg("--duration-s")
                .arg(format!("{:.3}", f.per_size.as_secs_f64().max(0.05)));
        }
    }
    c
}

/// The seed of flow `flow`'s source: the one the simulator's protocol
/// engine gives it, so that both draw the same schedule (and a load
/// calibrated on the simulator is the load the real run offers).
fn flow_seed(seed: u64, flow: usize) -> u64 {
    crate::backend::sim::mix(seed, flow as u64)
}

/// `rina-tgen client` arguments for a resolved profile.
fn profile_args(c: &mut Command, p: &Profile) {
    let f = ProfileFields::of(p);
    c.arg("--profile").arg(f.name);
    c.arg("--rate-bps").arg(f.rate_bps.to_string());
    c.arg("--size").arg(f.size.to_string());
    if let Some((on, off)) = f.on_off {
        c.arg("--on-s").arg(on.to_string());
        c.arg("--off-s").arg(off.to_string());
    }
}

/// A resolved profile as `rina-tgen` takes it: a named profile and the
/// overrides that make it this source (on its command line or in a
/// traffic matrix).
struct ProfileFields {
    name: &'static str,
    rate_bps: f64,
    size: usize,
    /// Mean ON (talk) and OFF (silence) periods, s.
    on_off: Option<(f64, f64)>,
}

impl ProfileFields {
    fn of(p: &Profile) -> ProfileFields {
        match *p {
            Profile::Cbr { rate_bps, size } => ProfileFields {
                name: "cbr",
                rate_bps,
                size,
                on_off: None,
            },
            Profile::Poisson { rate_bps, size } => ProfileFields {
                name: "poisson",
                rate_bps,
                size,
                on_off: None,
            },
            Profile::OnOff {
                on_s,
                off_s,
                rate_bps,
                size,
            } => ProfileFields {
                name: "on-off",
                rate_bps,
                size,
                on_off: Some((on_s, off_s)),
            },
            Profile::Voice {
                talk_size,
                talk_s,
                silence_s,
                ..
            } => ProfileFields {
                name: "voice",
                // The mean rate carries the SDU interval (a scaled experiment).
                rate_bps: p.mean_rate_bps(),
                size: talk_size,
                on_off: Some((talk_s, silence_s)),
            },
            Profile::Varying {
                min_bps,
                max_bps,
                segment_s,
                size,
            } => ProfileFields {
                // The named varying source closest in shape, scaled to max_bps.
                name: if min_bps <= 0.0 || segment_s < 1.5 {
                    "p2p"
                } else {
                    "video-hd"
                },
                rate_bps: max_bps,
                size,
                on_off: None,
            },
        }
    }
}

fn parse_echo(
    text: &str,
    rec: &mut FlowRecord,
    res: &mut Reservoir,
    active_s: f64,
) -> Result<(), String> {
    let r: rina_tools::echo::EchoReport =
        serde_json::from_str(text.trim()).map_err(|_| "no report from rina-echo".to_string())?;
    rec.sdu_bytes = r.size as f64;
    rec.sent = r.sent;
    rec.received = r.received;
    rec.loss_pct = r.loss_pct;
    let mut d: Vec<f64> = r.rtt_us.iter().map(|us| us / 2000.0).collect();
    for &x in &d {
        res.offer(&rec.class, x);
    }
    if let Some((mn, mean, p99, mx)) = stats_ms(&mut d) {
        rec.delay_min_ms = Some(mn);
        rec.delay_avg_ms = Some(mean);
        rec.delay_p99_ms = Some(p99);
        rec.delay_max_ms = Some(mx);
        rec.rtt_avg_ms = Some(mean * 2.0);
    }
    rec.goodput_bps = r.received as f64 * r.size as f64 * 8.0 / active_s;
    rec.allocation_ms = r.allocation_ms;
    Ok(())
}

/// A tgen flow's figures from `rina-tgen`'s report: its one flow, or flow
/// number `n` of a matrix. Its goodput is what arrived over the flow's
/// `active_s` seconds, as for echo and on the simulator (the tool's own
/// figure spans first to last arrival only, which leaves out the silences
/// of an ON-OFF profile).
fn parse_tgen(
    text: &str,
    n: Option<u32>,
    rec: &mut FlowRecord,
    res: &mut Reservoir,
    active_s: f64,
) -> Result<(), String> {
    let r: rina_tools::tgen::output::RunReport =
        serde_json::from_str(text.trim()).map_err(|_| "no report from rina-tgen".to_string())?;
    let f = match n {
        Some(n) => r.flows.iter().find(|e| e.flow == n),
        None => r.flows.first(),
    }
    .ok_or("rina-tgen reported no flow")?;
    rec.allocation_ms = f.allocation_ms;
    let fwd = f.reports.iter().find(|x| x.direction == "fwd");
    if let Some(fwd) = fwd {
        rec.sent = fwd.sent_sdus;
        rec.received = fwd.recv_sdus;
        rec.loss_pct = fwd.loss_pct;
        rec.goodput_bps = fwd.recv_bytes as f64 * 8.0 / active_s;
        if fwd.recv_sdus > 0 {
            rec.sdu_bytes = fwd.recv_bytes as f64 / fwd.recv_sdus as f64;
        }
        if let Some(d) = fwd.delay {
            rec.delay_min_ms = Some(d.min_us / 1e3);
            rec.delay_avg_ms = Some(d.avg_us / 1e3);
            rec.delay_p99_ms = Some(d.p99_us / 1e3);
            rec.delay_max_ms = Some(d.max_us / 1e3);
        }
        // Samples from the histogram (bin middles), if the report has one.
        if let Some(h) = &fwd.histogram {
            for &[lo, w, n] in h {
                let mid = (lo as f64 + w as f64 / 2.0) / 1e3;
                for _ in 0..n.min(100_000) {
                    res.offer(&rec.class, mid);
                }
            }
        }
    }
    if fwd.is_none() {
        // No REPORT from the server: what arrived is unknown, but the
        // client knows what it sent.
        if let Some(sent) = f.sent {
            rec.sent = sent.sdus;
        }
    }
    match (&f.error, fwd) {
        (Some(e), _) => Err(e.clone()),
        (None, None) => Err("no forward report from the tgen server".into()),
        _ => Ok(()),
    }
}

fn parse_perf(
    text: &str,
    rec: &mut FlowRecord,
    goodput: &mut Vec<GoodputPoint>,
) -> Result<(), String> {
    let r: rina_tools::perf::PerfReport =
        serde_json::from_str(text.trim()).map_err(|_| "no report from rina-perf".to_string())?;
    if r.tests.is_empty() {
        return Err("rina-perf ran no test".into());
    }
    perf_record(&r.tests, rec, goodput);
    rec.allocation_ms = r.allocation_ms;
    Ok(())
}

/// Fills `rec` and the goodput points from `rina-perf`'s test results
/// (one per SDU size): the real backends read them from the tool's
/// report, the simulator's protocol engine computes them with the tool's
/// code.
pub(crate) fn perf_record(
    tests: &[rina_tools::perf::TestResult],
    rec: &mut FlowRecord,
    goodput: &mut Vec<GoodputPoint>,
) {
    let mut gsum = 0.0;
    let mut ssum = 0.0;
    for t in tests {
        rec.sent += t.sent_sdus;
        rec.received += t.report.recv_sdus.min(t.sent_sdus);
        gsum += t.rx_mbps * 1e6;
        ssum += t.size as f64;
        goodput.push(GoodputPoint {
            series: rec.class.clone(),
            sdu_bytes: t.size,
            goodput_bps: t.rx_mbps * 1e6,
        });
    }
    let n = tests.len().max(1) as f64;
    rec.goodput_bps = gsum / n;
    rec.sdu_bytes = ssum / n;
    rec.loss_pct = if rec.sent == 0 {
        0.0
    } else {
        100.0 * rec.sent.saturating_sub(rec.received) as f64 / rec.sent as f64
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use rina_tools::tgen::output::{FlowEntry, RunReport, SentCount};

    fn client_report(sent: Option<SentCount>) -> String {
        let r = RunReport {
            tool: "rina-tgen".into(),
            schema: rina_tools::tgen::output::SCHEMA_VERSION,
            role: "client".into(),
            started_ns: 0,
            ended_ns: 1,
            flows: vec![FlowEntry {
                flow: 1,
                peer: "sink".into(),
                dif: "net".into(),
                profile: "cbr".into(),
                direction: Default::default(),
                seed: 1,
                qos: Default::default(),
                error: Some("no REPORT from the server".into()),
                reports: Vec::new(),
                sent,
                allocation_ms: Some(1.5),
            }],
            totals: None,
        };
        serde_json::to_string(&r).unwrap()
    }

    #[test]
    fn a_tgen_flow_without_the_servers_report_keeps_what_the_client_sent() {
        let mut rec = FlowRecord::default();
        let mut res = Reservoir::new(10, 1);
        let text = client_report(Some(SentCount {
            sdus: 120,
            bytes: 120 * 200,
        }));
        let r = parse_tgen(&text, None, &mut rec, &mut res, 1.0);
        assert_eq!(r, Err("no REPORT from the server".into()));
        assert_eq!(rec.sent, 120, "the client's count, not 0");
        assert_eq!(rec.received, 0);
        assert_eq!(rec.allocation_ms, Some(1.5));

        // A report from before the field existed still reads.
        let mut rec = FlowRecord::default();
        let old = client_report(None);
        assert!(!old.contains("\"sent\""));
        assert!(parse_tgen(&old, None, &mut rec, &mut res, 1.0).is_err());
        assert_eq!(rec.sent, 0);
    }

    #[test]
    fn a_tgen_flows_goodput_is_over_its_active_time_as_on_the_simulator() {
        // An ON-OFF flow (voip) that sent 28 SDUs of 160 B in 0.56 s of a
        // 4 s flow: rina-tgen's figure (first to last arrival) is 64 kb/s,
        // the simulator's (bytes over the flow's time) 8.96 kb/s.
        let mut r: RunReport = serde_json::from_str(&client_report(None)).unwrap();
        let fwd = serde_json::json!({
            "flow": 1, "direction": "fwd", "sent_sdus": 28, "sent_bytes": 4480,
            "recv_sdus": 28, "recv_bytes": 4480, "lost_sdus": 0, "loss_pct": 0.0,
            "duplicates": 0, "reordered": 0, "fin_received": true,
            "first_recv_ns": 0, "last_recv_ns": 560_000_000u64,
            "goodput_bps": 64000.0, "delay": null
        });
        r.flows[0].error = None;
        r.flows[0].reports = vec![serde_json::from_value(fwd).unwrap()];
        let text = serde_json::to_string(&r).unwrap();
        let mut rec = FlowRecord::default();
        let mut res = Reservoir::new(10, 1);
        parse_tgen(&text, None, &mut rec, &mut res, 4.0).unwrap();
        assert_eq!((rec.sent, rec.received), (28, 28));
        assert!(
            (rec.goodput_bps - 8960.0).abs() < 1e-6,
            "{}",
            rec.goodput_bps
        );
    }
}
