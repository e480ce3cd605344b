//! The experiment file as written: serde types that mirror the TOML one to
//! one (see `docs/rina-lab.md` for the reference). Nothing here is checked
//! beyond types; [`crate::resolve`] turns a [`File`] into a checked
//! [`crate::Experiment`] and names the line of whatever is wrong.
//!
//! Names that refer to other parts of the file (nodes, links, DIFs, cubes,
//! applications) are kept [`Spanned`] so that the error can point at them.

use crate::units::{Dur, Rate};
use rina_core::rmt::SchedulerConfig;
use rina_tools::tgen::gen::SourceSpec;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use toml::Spanned;

/// A whole experiment file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct File {
    /// Name, duration, seed.
    pub experiment: ExperimentSection,
    /// The systems, by name (top level: before `[experiment]`).
    #[serde(default)]
    pub nodes: Vec<Spanned<String>>,
    /// Named groups of nodes (`"@name"` in member lists).
    #[serde(default)]
    pub groups: BTreeMap<String, Vec<Spanned<String>>>,
    /// Physical links; each is a shim DIF of its own.
    #[serde(default, rename = "link")]
    pub links: Vec<Spanned<LinkDecl>>,
    /// Normal DIFs, each declared once.
    #[serde(default, rename = "dif")]
    pub difs: Vec<Spanned<DifDecl>>,
    /// Application registrations.
    #[serde(default, rename = "app")]
    pub apps: Vec<Spanned<AppDecl>>,
    /// Traffic profiles by name (a traffic class each).
    #[serde(default, rename = "profile")]
    pub profiles: Vec<Spanned<ProfileDecl>>,
    /// Traffic: tgen matrices, echo probes, perf runs.
    #[serde(default, rename = "traffic")]
    pub traffic: Vec<Spanned<TrafficDecl>>,
    /// Timed events.
    #[serde(default, rename = "event")]
    pub events: Vec<Spanned<EventDecl>>,
    /// Load calibration (seed 003's procedure).
    #[serde(default)]
    pub load: Option<Spanned<LoadDecl>>,
    /// Named variants of the experiment; each runs as its own run.
    #[serde(default, rename = "variant")]
    pub variants: Vec<Spanned<VariantDecl>>,
}

/// `[experiment]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ExperimentSection {
    /// Short name, used for the results folder.
    pub name: String,
    /// What the experiment reproduces.
    #[serde(default)]
    pub description: String,
    /// How long traffic runs.
    pub duration: Spanned<Dur>,
    /// Seed of every random draw (traffic, loss).
    #[serde(default)]
    pub seed: u64,
    /// Time given to enrollment and routing before traffic starts (default
    /// chosen by the backend).
    #[serde(default)]
    pub warmup: Option<Dur>,
    /// Caught only to say that `nodes` goes before `[experiment]` (TOML
    /// puts a key written after a table header into that table).
    #[serde(default, skip_serializing)]
    pub nodes: Option<Spanned<toml::Value>>,
}

/// `[[link]]`: a point-to-point link between two nodes.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LinkDecl {
    /// The two ends.
    pub between: [Spanned<String>; 2],
    /// Name; default `"a--b"`.
    #[serde(default)]
    pub name: Option<String>,
    /// Rate (default unlimited: 10 Gb/s).
    #[serde(default)]
    pub rate: Option<Rate>,
    /// One-way propagation delay (default 0).
    #[serde(default)]
    pub delay: Option<Dur>,
    /// Random loss probability per frame (default 0).
    #[serde(default)]
    pub loss: Option<f64>,
    /// Transmit queue of the link, frames (default 1000).
    #[serde(default)]
    pub queue: Option<usize>,
    /// Group names of the link (load calibration selects links by group).
    #[serde(default)]
    pub groups: Vec<String>,
}

/// `[[dif]]`: a normal DIF.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DifDecl {
    /// DIF name.
    pub name: Spanned<String>,
    /// Members: node names, `"@group"`, or `"*"` (every node).
    pub members: Vec<Spanned<String>>,
    /// What it runs over: `"links"` (the link shims between two members)
    /// and/or names of lower normal DIFs.
    pub over: Vec<Spanned<String>>,
    /// Adjacencies over lower normal DIFs, as pairs of members; default:
    /// every pair of members that are both members of that lower DIF.
    #[serde(default)]
    pub adjacency: Option<Vec<[Spanned<String>; 2]>>,
    /// RMT scheduling policy of every port (default FIFO).
    #[serde(default)]
    pub scheduler: Option<SchedulerConfig>,
    /// QoS cubes (default: one best-effort cube and one reliable).
    #[serde(default, rename = "cube")]
    pub cubes: Vec<Spanned<CubeDecl>>,
    /// Pre-shared enrollment password.
    #[serde(default)]
    pub password: Option<String>,
    /// Largest PDU (default: what the link shim carries over links, 1499
    /// over shim-udp and 1495 over shim-eth; 9000 for a DIF only over
    /// other DIFs).
    #[serde(default)]
    pub max_pdu: Option<u32>,
}

/// `[[dif.cube]]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CubeDecl {
    /// Cube name (unique in the DIF).
    pub name: Spanned<String>,
    /// QoS-id (default: position in the list, from 1).
    #[serde(default)]
    pub id: Option<u64>,
    /// Urgency level, 0 = most urgent.
    #[serde(default)]
    pub urgency: u8,
    /// Cherish level, 0 = most cherished.
    #[serde(default)]
    pub cherish: u8,
    /// Retransmission and in-order delivery.
    #[serde(default)]
    pub reliable: bool,
    /// Name of the cube of each lower DIF that carries this cube
    /// (`{ mr = "A1" }`); default: the lower DIF's cube with the same name,
    /// else its first cube.
    #[serde(default)]
    pub maps_to: BTreeMap<String, Spanned<String>>,
    /// Declared average bandwidth.
    #[serde(default)]
    pub bandwidth: Option<Rate>,
    /// Declared delay bound.
    #[serde(default)]
    pub delay: Option<Dur>,
    /// Declared loss bound (probability).
    #[serde(default)]
    pub loss: Option<f64>,
    /// Keepalive of the cube's flows (`keepalive = "5s"`; 10 ms to 1 h;
    /// default off): see `rina_core::normal::keepalive`.
    #[serde(default)]
    pub keepalive: Option<Spanned<Dur>>,
    /// EFCP policies and parameters (`efcp = { congestion_control =
    /// "aimd", window = 128 }`; see `rina_core::efcp::EfcpTuning`).
    #[serde(default)]
    pub efcp: rina_core::efcp::EfcpTuning,
}

/// `[[app]]`: an application registered at a node in a DIF.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AppDecl {
    /// Application name.
    pub name: Spanned<String>,
    /// Node it runs at.
    pub node: Spanned<String>,
    /// DIF it registers in.
    pub dif: Spanned<String>,
    /// What it does when a flow arrives: `echo` (default) or `sink`.
    #[serde(default)]
    pub role: AppRole,
}

/// What an application does with a flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum AppRole {
    /// Sends every SDU back.
    #[default]
    Echo,
    /// Counts and timestamps what arrives (tgen / perf receiver).
    Sink,
}

/// `[[profile]]`: a named traffic class and its source.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ProfileDecl {
    /// Class name (a row of the summary table).
    pub name: Spanned<String>,
    /// QoS cube asked for (by name, in the traffic's DIF).
    #[serde(default)]
    pub cube: Option<Spanned<String>>,
    /// A `rina-tgen` profile name (`rina-tgen profiles` lists them).
    pub profile: String,
    /// Rate override (CBR, Poisson, ON-OFF during ON, varying maximum).
    #[serde(default)]
    pub rate: Option<Rate>,
    /// SDU size override, bytes.
    #[serde(default)]
    pub size: Option<usize>,
    /// Mean ON (talk) period override.
    #[serde(default)]
    pub on: Option<Dur>,
    /// Mean OFF (silence) period override.
    #[serde(default)]
    pub off: Option<Dur>,
}

impl ProfileDecl {
    /// The source as `rina-tgen` takes it.
    pub fn source(&self) -> SourceSpec {
        SourceSpec {
            profile: self.profile.clone(),
            rate_bps: self.rate.map(|r| r.bps()),
            size: self.size,
            on_s: self.on.map(|d| d.get().as_secs_f64()),
            off_s: self.off.map(|d| d.get().as_secs_f64()),
        }
    }
}

/// What a traffic item is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TrafficKind {
    /// rina-tgen flows: profiles × pairs, one-way delay and loss.
    Tgen,
    /// rina-echo probes: RTT.
    Echo,
    /// rina-perf runs: goodput against SDU size.
    Perf,
}

/// `[[traffic]]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TrafficDecl {
    /// tgen, echo or perf.
    pub kind: TrafficKind,
    /// DIF the flows are allocated in; `"links"`: directly over the shim
    /// DIF of the link between the two ends (they must be neighbours).
    pub dif: Spanned<String>,
    /// tgen: profile names (each a class).
    #[serde(default)]
    pub profiles: Vec<Spanned<String>>,
    /// Pairs of nodes `[from, to]`; the receiver is registered implicitly.
    #[serde(default)]
    pub pairs: Vec<[Spanned<String>; 2]>,
    /// Sources (node names, `"@group"`, `"*"`), with `to`.
    #[serde(default)]
    pub from: Vec<Spanned<String>>,
    /// Destination node (with `from`).
    #[serde(default)]
    pub to: Option<Spanned<String>>,
    /// Destination application (by name, from `[[app]]`), instead of `to`.
    #[serde(default)]
    pub app: Option<Spanned<String>>,
    /// Traffic both ways (tgen).
    #[serde(default)]
    pub bidirectional: bool,
    /// QoS cube (echo, perf; tgen takes it from the profile).
    #[serde(default)]
    pub cube: Option<Spanned<String>>,
    /// Class name in the results (echo, perf; default the kind).
    #[serde(default)]
    pub class: Option<String>,
    /// Echo: time between probes (default 100 ms).
    #[serde(default)]
    pub interval: Option<Dur>,
    /// Echo: probe size in bytes (default 64).
    #[serde(default)]
    pub size: Option<usize>,
    /// Perf: SDU sizes to sweep, bytes.
    #[serde(default)]
    pub sdu_sizes: Vec<usize>,
    /// Perf: time per SDU size (default 2 s).
    #[serde(default)]
    pub per_size: Option<Dur>,
    /// When the traffic starts (default 0, after warm-up).
    #[serde(default)]
    pub start: Option<Dur>,
    /// When it stops (default the end of the experiment).
    #[serde(default)]
    pub stop: Option<Dur>,
    /// Parallel flows per pair and profile (default 1).
    #[serde(default)]
    pub count: Option<usize>,
    /// Only in these variants (default: in all).
    #[serde(default)]
    pub variants: Vec<String>,
}

/// What a timed event does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum EventAction {
    /// The link stops carrying frames (both ways).
    LinkDown,
    /// The link carries frames again.
    LinkUp,
    /// The node's daemon stops.
    NodeStop,
    /// The node's daemon starts again with the same configuration.
    NodeStart,
    /// An application unregisters at its node and registers at `to`.
    AppMove,
}

/// `[[event]]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct EventDecl {
    /// Time from the start of traffic.
    pub at: Dur,
    /// What happens.
    pub action: EventAction,
    /// link-down / link-up: the link's name.
    #[serde(default)]
    pub link: Option<Spanned<String>>,
    /// node-stop / node-start: the node.
    #[serde(default)]
    pub node: Option<Spanned<String>>,
    /// app-move: the application.
    #[serde(default)]
    pub app: Option<Spanned<String>>,
    /// app-move: the node it moves to.
    #[serde(default)]
    pub to: Option<Spanned<String>>,
}

/// `[load]`: before the measured run, run once with unlimited rates on the
/// selected links, measure each link's average bit rate (busier direction),
/// and set its rate so that this average is `target` of it.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LoadDecl {
    /// Target load, 0 < target < 1 (seed 003: 0.8 and 0.9).
    pub target: f64,
    /// Link groups (or link names) calibrated.
    pub links: Vec<Spanned<String>>,
    /// Length of the calibration run (default: the experiment's duration).
    #[serde(default)]
    pub duration: Option<Dur>,
    /// Traffic classes (profile names) left out of the calibration run:
    /// they run on top of the calibrated load (seed 003's video demo).
    #[serde(default)]
    pub without: Vec<Spanned<String>>,
}

/// `[[variant]]`: a named change to the experiment.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct VariantDecl {
    /// Name (a run folder and a section of the summary).
    pub name: Spanned<String>,
    /// Load target instead of `[load].target`.
    #[serde(default)]
    pub load: Option<f64>,
    /// Scheduling policy per DIF name, replacing the DIF's own.
    #[serde(default)]
    pub scheduler: BTreeMap<String, SchedulerConfig>,
    /// Link rates per link name or `"@group"`, replacing the declared.
    #[serde(default)]
    pub rate: BTreeMap<String, Rate>,
    /// Per DIF name, the one cube of each lower DIF that *every* cube of
    /// the DIF rides on, replacing the cubes' own `maps_to` (seed 003's
    /// SPN-only deployment: one MR flow per PE pair). Written
    /// `maps_to.spn = { mr = "A1" }`.
    #[serde(default)]
    pub maps_to: BTreeMap<String, BTreeMap<String, String>>,
}
