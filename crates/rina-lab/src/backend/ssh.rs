//! The `ssh` backend: every node on a host reached over SSH (a testbed:
//! jFed/Fed4FIRE, Emulab/CloudLab, lab machines), driven from here.
//!
//! An inventory file (`--inventory FILE`, format in `docs/rina-lab.md`)
//! maps nodes to hosts and says how each link is made: shim-udp between
//! two IP addresses (by default the hosts' addresses, ports from
//! `udp_port`), or shim-eth on an interface of each end.
//!
//! A run:
//!
//! 1. measures each host's clock offset against this machine (eight
//!    exchanges in one SSH session, the one with the shortest round trip
//!    kept) and writes `clocks.json`: one-way delays of `rina-tgen` are
//!    trusted when every host's offset and its uncertainty are within
//!    [`ONE_WAY_TOLERANCE_MS`], else the run is in RTT mode (the timeline
//!    says which);
//! 2. copies `rinad`, the tools and a small wrapper (`scp`) into
//!    `<dir>/bin-<stamp>` on each host, once per build (the stamp is made
//!    of the files' sizes and times);
//! 3. copies each node's configuration into `<dir>/<run>/` and starts
//!    `rinad` and the tools there through the wrapper, which records their
//!    pids and stops them when their SSH session goes away; their output
//!    comes back over SSH into the run's folder (`logs/`, `out/`);
//! 4. after the traffic, saves each node's `rinactl ipcps` and `flows`
//!    (JSON, with counters) in `counters/`;
//! 5. on every host, kills what the run started and removes `<dir>/<run>`,
//!    also on failure or Ctrl-C (and on drop).
//!
//! Links are the testbed's: the experiment's rates are paced by `rinad`
//! (the `rate` key), delay and loss are added in `rinad`'s transmit path
//! on shim-eth links only; on shim-udp links they are the network's. Link
//! load is read from the interfaces' counters on shim-eth links; on
//! shim-udp links it is not measured (0), see `counters/`.

use super::real::{self, Fabric, ShimKind};
use super::{Backend, RunCtx};
use crate::results::RunOutput;
use crate::{Experiment, LabError};
use rina_wire::shim_eth::MAX_VLAN;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};
use thiserror::Error;

/// Largest clock offset plus uncertainty, ms, with which one-way delays
/// are trusted.
pub const ONE_WAY_TOLERANCE_MS: f64 = 1.0;

/// The wrapper every remote program runs under: `wrap.sh RUNDIR PROGRAM
/// ARGS...` runs the program, appends its pid to `RUNDIR/pids`, and kills
/// it when the wrapper's parent (the SSH session) changes, i.e. when the
/// `ssh` client here was killed or the connection dropped.
const WRAPPER: &str = r#"# rina-lab: run "$@" for the ssh backend; stop it when the session ends.
run=$1; shift
"$@" &
p=$!
echo "$p" >> "$run/pids"
pp=$PPID
trap 'kill $p 2>/dev/null' HUP INT TERM
while kill -0 "$p" 2>/dev/null; do
    q=1
    read -r _ _ _ q _ < /proc/$$/stat
    if [ "$q" != "$pp" ]; then
        kill "$p" 2>/dev/null
        break
    fi
    sleep 0.2
done
wait "$p"
"#;

/// Programs copied to every host.
const PROGRAMS: [&str; 5] = ["rinad", "rinactl", "rina-echo", "rina-tgen", "rina-perf"];

/// What is wrong with an inventory.
#[derive(Debug, Error)]
pub enum InventoryError {
    /// The file could not be read.
    #[error("{path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not a valid inventory (TOML syntax, unknown keys, types).
    #[error("{0}")]
    Parse(String),
    /// A host lists a node the experiment does not have.
    #[error("host `{host}` lists node `{node}`, which the experiment does not have")]
    UnknownNode {
        /// The host.
        host: String,
        /// The node.
        node: String,
    },
    /// A node of the experiment is on no host.
    #[error("node `{0}` is on no host of the inventory")]
    Unplaced(String),
    /// A node is listed on two hosts.
    #[error("node `{0}` is on two hosts")]
    TwicePlaced(String),
    /// A `[link.NAME]` table names a link the experiment does not have.
    #[error("the inventory has link `{0}`, which the experiment does not have")]
    UnknownLink(String),
    /// A link table does not give exactly its two ends, gives both `udp`
    /// and `eth`, or a shim-eth link's VLAN (given, or 10 + the link's
    /// index) is not 1..=4094.
    #[error("link `{link}`: {what}")]
    BadLink {
        /// The link.
        link: String,
        /// What is wrong.
        what: String,
    },
    /// A shim-udp end without a port of its own takes `udp_port` + 2 × its
    /// link's index (+ 1 for end B), which must not pass 65535.
    #[error("link `{link}`: its default UDP port, udp_port {udp_port} + 2 × its index {index} (+ 1 for end B), exceeds 65535: lower udp_port or give the links ports in [link.NAME]")]
    UdpPortRange {
        /// The link.
        link: String,
        /// Its index among the experiment's links.
        index: usize,
        /// The inventory's `udp_port`.
        udp_port: u16,
    },
    /// A shim-udp link by default needs the host's address to be an IP
    /// address (or the host's `ip` key).
    #[error("host `{0}`: `address` is not an IP address; give `ip` (for shim-udp links) or map the link in [link.NAME]")]
    NoIp(String),
    /// A name or path goes into a remote command line and must be made of
    /// letters, digits and `._-+/@:`.
    #[error("`{0}` cannot go into a remote command line (letters, digits and ._-+/@: only)")]
    Unsafe(String),
    /// The remote folder must be an absolute path.
    #[error("dir `{0}` is not an absolute path")]
    RelativeDir(String),
}

/// The inventory file as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Inventory {
    /// Default SSH user (else ssh's default).
    #[serde(default)]
    pub user: Option<String>,
    /// Default private key file.
    #[serde(default)]
    pub key: Option<PathBuf>,
    /// Default SSH port.
    #[serde(default)]
    pub port: Option<u16>,
    /// Folder on the hosts for binaries and runs (absolute).
    #[serde(default = "default_dir")]
    pub dir: String,
    /// More `ssh`/`scp` arguments (e.g. `["-o", "StrictHostKeyChecking=no"]`).
    #[serde(default)]
    pub ssh_options: Vec<String>,
    /// First UDP port of shim-udp links made by default (two per link).
    #[serde(default = "default_udp_port")]
    pub udp_port: u16,
    /// The hosts.
    #[serde(default, rename = "host")]
    pub hosts: Vec<Host>,
    /// How links are made, by link name (default: shim-udp between the
    /// hosts' addresses).
    #[serde(default, rename = "link")]
    pub links: BTreeMap<String, LinkMap>,
}

/// One host.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Host {
    /// Its name (for messages and `clocks.json`).
    pub name: String,
    /// Where SSH connects (name or IP address).
    pub address: String,
    /// SSH user (else the inventory's).
    #[serde(default)]
    pub user: Option<String>,
    /// Private key (else the inventory's).
    #[serde(default)]
    pub key: Option<PathBuf>,
    /// SSH port (else the inventory's, else 22).
    #[serde(default)]
    pub port: Option<u16>,
    /// IP address of shim-udp links made by default (else `address`).
    #[serde(default)]
    pub ip: Option<IpAddr>,
    /// The experiment's nodes it runs.
    pub nodes: Vec<String>,
}

/// How one link is made: `udp = { a = "10.0.0.1", b = "10.0.0.2" }` (IP,
/// or IP:port, of each end by node name) or `eth = { a = "eth1", b =
/// "eth2" }` (interface of each end) with an optional `vlan`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkMap {
    /// shim-udp: each end's address.
    #[serde(default)]
    pub udp: BTreeMap<String, String>,
    /// shim-eth: each end's interface.
    #[serde(default)]
    pub eth: BTreeMap<String, String>,
    /// shim-eth: the VLAN, 1..=4094 (default 10 + the link's index).
    #[serde(default)]
    pub vlan: Option<u16>,
}

fn default_dir() -> String {
    "/tmp/rina-lab".into()
}

fn default_udp_port() -> u16 {
    47000
}

impl Inventory {
    /// Parses an inventory.
    pub fn parse(text: &str) -> Result<Inventory, InventoryError> {
        toml::from_str(text).map_err(|e| InventoryError::Parse(e.to_string()))
    }

    /// Reads and parses an inventory file.
    pub fn load(path: &Path) -> Result<Inventory, InventoryError> {
        let text = std::fs::read_to_string(path).map_err(|e| InventoryError::Read {
            path: path.display().to_string(),
            source: e,
        })?;
        Self::parse(&text)
    }
}

fn safe(s: &str) -> Result<(), InventoryError> {
    let ok = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-+/@:".contains(c));
    if ok {
        Ok(())
    } else {
        Err(InventoryError::Unsafe(s.into()))
    }
}

/// How a link is made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkPlan {
    /// shim-udp: the address of end A, of end B.
    Udp([SocketAddr; 2]),
    /// shim-eth: the interface of end A, of end B, and the VLAN.
    Eth([String; 2], u16),
}

/// An inventory checked against an experiment.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Per host: `ssh` arguments up to and including the destination.
    pub ssh: Vec<Vec<String>>,
    /// Per host: `scp` arguments before the files, and its destination
    /// prefix (`user@address:`).
    pub scp: Vec<(Vec<String>, String)>,
    /// Per host: its name.
    pub host_names: Vec<String>,
    /// Per node: its host.
    pub node_host: Vec<usize>,
    /// Per link: how it is made.
    pub links: Vec<LinkPlan>,
    /// The remote folder.
    pub dir: String,
}

impl Plan {
    /// Checks `inv` against `exp`.
    pub fn new(inv: &Inventory, exp: &Experiment) -> Result<Plan, InventoryError> {
        if !inv.dir.starts_with('/') {
            return Err(InventoryError::RelativeDir(inv.dir.clone()));
        }
        safe(&inv.dir)?;
        for n in exp
            .nodes
            .iter()
            .chain(exp.links.iter().map(|l| &l.name))
            .chain(exp.difs.iter().map(|d| &d.name))
            .chain(exp.apps.iter().map(|a| &a.name))
        {
            safe(n)?;
        }
        let mut node_host: Vec<Option<usize>> = vec![None; exp.nodes.len()];
        let mut plan = Plan {
            ssh: Vec::new(),
            scp: Vec::new(),
            host_names: Vec::new(),
            node_host: Vec::new(),
            links: Vec::new(),
            dir: inv.dir.trim_end_matches('/').to_string(),
        };
        for (h, host) in inv.hosts.iter().enumerate() {
            for node in &host.nodes {
                let Some(n) = exp.nodes.iter().position(|x| x == node) else {
                    return Err(InventoryError::UnknownNode {
                        host: host.name.clone(),
                        node: node.clone(),
                    });
                };
                if node_host[n].replace(h).is_some() {
                    return Err(InventoryError::TwicePlaced(node.clone()));
                }
            }
            let (ssh, scp) = host_args(inv, host);
            plan.ssh.push(ssh);
            plan.scp.push(scp);
            plan.host_names.push(host.name.clone());
        }
        for (n, h) in node_host.iter().enumerate() {
            match h {
                Some(h) => plan.node_host.push(*h),
                None => return Err(InventoryError::Unplaced(exp.nodes[n].clone())),
            }
        }
        for name in inv.links.keys() {
            if !exp.links.iter().any(|l| &l.name == name) {
                return Err(InventoryError::UnknownLink(name.clone()));
            }
        }
        for (i, l) in exp.links.iter().enumerate() {
            let ends = [&exp.nodes[l.a], &exp.nodes[l.b]];
            let host_ip = |n: usize| -> Result<IpAddr, InventoryError> {
                let host = &inv.hosts[plan.node_host[n]];
                host.ip
                    .or_else(|| host.address.parse().ok())
                    .ok_or_else(|| InventoryError::NoIp(host.name.clone()))
            };
            // Ports and VLAN by default, checked where they are used (a
            // link given its ports or VLAN needs none).
            let port = |side: u32| -> Result<u16, InventoryError> {
                u32::try_from(i)
                    .ok()
                    .and_then(|i| i.checked_mul(2))
                    .and_then(|o| o.checked_add(side))
                    .and_then(|o| o.checked_add(u32::from(inv.udp_port)))
                    .and_then(|p| u16::try_from(p).ok())
                    .ok_or_else(|| InventoryError::UdpPortRange {
                        link: l.name.clone(),
                        index: i,
                        udp_port: inv.udp_port,
                    })
            };
            let p = match inv.links.get(&l.name) {
                None => LinkPlan::Udp([
                    SocketAddr::new(host_ip(l.a)?, port(0)?),
                    SocketAddr::new(host_ip(l.b)?, port(1)?),
                ]),
                Some(m) => link_plan(&l.name, m, ends, &port, i)?,
            };
            plan.links.push(p);
        }
        Ok(plan)
    }
}

/// The `ssh` and `scp` arguments of a host.
fn host_args(inv: &Inventory, host: &Host) -> (Vec<String>, (Vec<String>, String)) {
    let mut common: Vec<String> = [
        "BatchMode=yes",
        "ConnectTimeout=10",
        "ServerAliveInterval=5",
        "ServerAliveCountMax=3",
        "LogLevel=ERROR",
    ]
    .iter()
    .flat_map(|o| ["-o".to_string(), o.to_string()])
    .collect();
    if let Some(k) = host.key.as_ref().or(inv.key.as_ref()) {
        common.push("-i".into());
        common.push(k.display().to_string());
    }
    common.extend(inv.ssh_options.iter().cloned());
    let port = host.port.or(inv.port);
    let user = host.user.as_ref().or(inv.user.as_ref());
    let target = match user {
        Some(u) => format!("{u}@{}", host.address),
        None => host.address.clone(),
    };
    let mut ssh = common.clone();
    let mut scp = common;
    if let Some(p) = port {
        ssh.extend(["-p".to_string(), p.to_string()]);
        scp.extend(["-P".to_string(), p.to_string()]);
    }
    ssh.push(target.clone());
    let scp_target = match (user, host.address.contains(':')) {
        (Some(u), true) => format!("{u}@[{}]:", host.address),
        (None, true) => format!("[{}]:", host.address),
        _ => format!("{target}:"),
    };
    (ssh, (scp, scp_target))
}

/// A link mapped in the inventory.
fn link_plan(
    name: &str,
    m: &LinkMap,
    ends: [&String; 2],
    port: &dyn Fn(u32) -> Result<u16, InventoryError>,
    index: usize,
) -> Result<LinkPlan, InventoryError> {
    let bad = |what: String| InventoryError::BadLink {
        link: name.into(),
        what,
    };
    let pick = |map: &BTreeMap<String, String>| -> Result<[String; 2], InventoryError> {
        if let Some(k) = map.keys().find(|k| !ends.contains(k)) {
            return Err(bad(format!("`{k}` is not one of its ends")));
        }
        let get = |e: &String| {
            map.get(e)
                .cloned()
                .ok_or_else(|| bad(format!("no entry for end `{e}`")))
        };
        Ok([get(ends[0])?, get(ends[1])?])
    };
    match (m.udp.is_empty(), m.eth.is_empty()) {
        (false, true) => {
            let [a, b] = pick(&m.udp)?;
            let addr = |s: &str, side: u32| -> Result<SocketAddr, InventoryError> {
                if let Ok(a) = s.parse::<SocketAddr>() {
                    return Ok(a);
                }
                let ip = s
                    .parse::<IpAddr>()
                    .map_err(|_| bad(format!("`{s}` is not an IP address")))?;
                Ok(SocketAddr::new(ip, port(side)?))
            };
            Ok(LinkPlan::Udp([addr(&a, 0)?, addr(&b, 1)?]))
        }
        (true, false) => {
            let [a, b] = pick(&m.eth)?;
            safe(&a)?;
            safe(&b)?;
            let vlan = match m.vlan {
                Some(v) if (1..=MAX_VLAN).contains(&v) => v,
                Some(v) => return Err(bad(format!("vlan {v} is not a VLAN id (1..={MAX_VLAN})"))),
                None => index
                    .checked_add(10)
                    .and_then(|v| u16::try_from(v).ok())
                    .filter(|v| *v <= MAX_VLAN)
                    .ok_or_else(|| {
                        bad(format!(
                            "its default VLAN, 10 + its index {index}, exceeds {MAX_VLAN}: give it `vlan`"
                        ))
                    })?,
            };
            Ok(LinkPlan::Eth([a, b], vlan))
        }
        _ => Err(bad("give either `udp` or `eth`".into())),
    }
}

/// The `ssh` backend.
#[derive(Debug, Default)]
pub struct Ssh {
    /// The inventory (`--inventory`); without it the backend cannot run.
    pub inventory: Option<Inventory>,
}

impl Ssh {
    /// The backend with this inventory.
    pub fn new(inventory: Inventory) -> Ssh {
        Ssh {
            inventory: Some(inventory),
        }
    }
}

fn unsupported(reason: impl Into<String>) -> LabError {
    LabError::Unsupported {
        backend: "ssh",
        reason: reason.into(),
    }
}

fn fail(what: impl Into<String>) -> LabError {
    LabError::Backend {
        backend: "ssh",
        what: what.into(),
    }
}

impl Backend for Ssh {
    fn name(&self) -> &'static str {
        "ssh"
    }

    fn check(&self) -> Result<(), LabError> {
        if self.inventory.is_none() {
            return Err(unsupported(
                "needs an inventory of hosts: --inventory FILE (see docs/rina-lab.md)",
            ));
        }
        for t in ["ssh", "scp"] {
            let ok = Command::new(t)
                .arg("-V")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok();
            if !ok {
                return Err(unsupported(format!(
                    "`{t}` (openssh-client) is not installed"
                )));
            }
        }
        real::Bins::find("ssh").map(|_| ())
    }

    fn run_once(&mut self, exp: &Experiment, ctx: &RunCtx<'_>) -> Result<RunOutput, LabError> {
        self.check()?;
        let inv = self
            .inventory
            .as_ref()
            .ok_or_else(|| unsupported("no inventory"))?;
        let plan = Plan::new(inv, exp).map_err(|e| unsupported(format!("inventory: {e}")))?;
        let bins = real::Bins::find("ssh")?;
        let mut fabric = Hosts::new(plan, bins);
        real::run(exp, ctx, &mut fabric)
    }
}

/// One host's clock against this machine's.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Clock {
    /// The host.
    pub host: String,
    /// Its clock minus this machine's, ms.
    pub offset_ms: f64,
    /// Round trip of the exchange the offset comes from, ms (the offset is
    /// within half of it).
    pub rtt_ms: f64,
}

/// The hosts of one run.
struct Hosts {
    plan: Plan,
    bins: real::Bins,
    /// This run's folder on the hosts.
    run_dir: String,
    /// The binaries' folder on the hosts.
    bin_dir: String,
    /// Per link: (delay µs, loss, seed), as in netns.
    impair: Vec<(u64, f64, u64)>,
    link_nodes: Vec<(usize, usize)>,
    node_names: Vec<String>,
    /// The local run folder.
    local_dir: PathBuf,
    clocks: Vec<Clock>,
    /// Per link: the last counters read (bytes sent A to B, B to A), and
    /// whether they are still to be used (see [`Fabric::link_counters`]).
    counters: Mutex<(Vec<(u64, u64)>, bool)>,
    /// Hosts on which the run folder was made (to clean up).
    made: Vec<bool>,
}

fn now_s() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

impl Hosts {
    fn new(plan: Plan, bins: real::Bins) -> Hosts {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let run_dir = format!("{}/run-{}-{}", plan.dir, std::process::id(), nanos);
        let made = vec![false; plan.ssh.len()];
        Hosts {
            plan,
            bins,
            run_dir,
            bin_dir: String::new(),
            impair: Vec::new(),
            link_nodes: Vec::new(),
            node_names: Vec::new(),
            local_dir: PathBuf::new(),
            clocks: Vec::new(),
            counters: Mutex::new((Vec::new(), false)),
            made,
        }
    }

    fn ssh(&self, host: usize) -> Command {
        let mut c = Command::new("ssh");
        c.args(&self.plan.ssh[host]);
        c
    }

    /// Runs `script` on `host` (its shell); its stdout, or an error.
    fn on(&self, host: usize, script: &str) -> Result<String, LabError> {
        let o = self
            .ssh(host)
            .arg(script)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| fail(format!("ssh: {e}")))?;
        if o.status.success() {
            Ok(String::from_utf8_lossy(&o.stdout).into_owned())
        } else {
            Err(fail(format!(
                "on {}: `{script}` failed: {}",
                self.plan.host_names[host],
                String::from_utf8_lossy(&o.stderr).trim()
            )))
        }
    }

    /// Copies local files into `dest` (a folder) on `host`.
    fn copy(&self, host: usize, files: &[PathBuf], dest: &str) -> Result<(), LabError> {
        let (args, target) = &self.plan.scp[host];
        let o = Command::new("scp")
            .arg("-q")
            .args(args)
            .args(files)
            .arg(format!("{target}{dest}/"))
            .stdin(Stdio::null())
            .output()
            .map_err(|e| fail(format!("scp: {e}")))?;
        if o.status.success() {
            Ok(())
        } else {
            Err(fail(format!(
                "copying to {}: {}",
                self.plan.host_names[host],
                String::from_utf8_lossy(&o.stderr).trim()
            )))
        }
    }

    /// Measures `host`'s clock: eight exchanges in one session, the
    /// shortest kept.
    fn clock(&self, host: usize) -> Result<Clock, LabError> {
        let mut child = self
            .ssh(host)
            .arg("while read -r x; do date +%s.%N; done")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| fail(format!("ssh: {e}")))?;
        let name = &self.plan.host_names[host];
        let mut best: Option<Clock> = None;
        let result = (|| -> Result<(), String> {
            let mut stdin = child.stdin.take().ok_or("no stdin")?;
            let mut lines = BufReader::new(child.stdout.take().ok_or("no stdout")?).lines();
            for _ in 0..8 {
                let t0 = now_s();
                stdin
                    .write_all(b"x\n")
                    .and_then(|_| stdin.flush())
                    .map_err(|e| e.to_string())?;
                let line = lines
                    .next()
                    .ok_or("session closed")?
                    .map_err(|e| e.to_string())?;
                let t1 = now_s();
                let remote: f64 = line
                    .trim()
                    .parse()
                    .map_err(|_| format!("`date +%s.%N` printed `{}`", line.trim()))?;
                let c = Clock {
                    host: name.clone(),
                    offset_ms: (remote - (t0 + t1) / 2.0) * 1e3,
                    rtt_ms: (t1 - t0) * 1e3,
                };
                if best.as_ref().is_none_or(|b| c.rtt_ms < b.rtt_ms) {
                    best = Some(c);
                }
            }
            Ok(())
        })();
        let _ = child.kill();
        let _ = child.wait();
        let mut errs = String::new();
        if let Some(mut e) = child.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut e, &mut errs);
        }
        match (result, best) {
            (Ok(()), Some(c)) => Ok(c),
            (Err(e), _) => Err(fail(format!(
                "measuring the clock of {name}: {e} {}",
                errs.trim()
            ))),
            (Ok(()), None) => Err(fail(format!("measuring the clock of {name}"))),
        }
    }

    /// Whether one-way delays can be trusted with these clocks.
    fn one_way(&self) -> bool {
        self.clocks
            .iter()
            .all(|c| c.offset_ms.abs() + c.rtt_ms / 2.0 <= ONE_WAY_TOLERANCE_MS)
    }

    /// Writes the wrapper next to the run and returns the files to copy and
    /// the stamp of this build.
    fn payload(&self, dir: &Path) -> Result<(Vec<PathBuf>, String), LabError> {
        let wrap = dir.join("ssh-wrap.sh");
        std::fs::write(&wrap, WRAPPER).map_err(|e| LabError::io(&wrap, e))?;
        let mut files = vec![self.bins.rinad.clone()];
        files.extend(PROGRAMS[1..].iter().map(|p| self.bins.tools.join(p)));
        let mut h = std::collections::hash_map::DefaultHasher::new();
        WRAPPER.hash(&mut h);
        for f in &files {
            let m = std::fs::metadata(f).map_err(|e| LabError::io(f, e))?;
            m.len().hash(&mut h);
            m.modified()
                .ok()
                .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                .map(|d| d.as_nanos())
                .hash(&mut h);
        }
        files.push(wrap);
        Ok((files, format!("{:016x}", h.finish())))
    }

    /// The host of `node`.
    fn host(&self, node: usize) -> usize {
        self.plan.node_host[node]
    }

    /// Kills what the run started on `host` and removes its folder.
    fn clean(&self, host: usize) {
        let r = &self.run_dir;
        let script = format!(
            "if [ -f {r}/pids ]; then kill $(cat {r}/pids) 2>/dev/null; sleep 0.3; \
             kill -9 $(cat {r}/pids) 2>/dev/null; fi; rm -rf {r}; true"
        );
        let _ = self.on(host, &script);
    }

    /// Reads the transmitted bytes of every shim-eth link end, one `ssh`
    /// per host, all hosts at once (an SSH login takes a good part of a
    /// second: one after the other they would delay the traffic).
    fn refresh_counters(&self) -> Vec<(u64, u64)> {
        // Per host: the (link, side, interface) it reads.
        let mut reads: Vec<Vec<(usize, usize, String)>> = vec![Vec::new(); self.plan.ssh.len()];
        for (l, p) in self.plan.links.iter().enumerate() {
            if let LinkPlan::Eth(ifs, _) = p {
                let (a, b) = self.link_nodes[l];
                reads[self.host(a)].push((l, 0, ifs[0].clone()));
                reads[self.host(b)].push((l, 1, ifs[1].clone()));
            }
        }
        let children: Vec<_> = reads
            .iter()
            .enumerate()
            .filter(|(_, r)| !r.is_empty())
            .map(|(h, r)| {
                let script: Vec<String> = r
                    .iter()
                    .map(|(_, _, d)| {
                        format!("cat /sys/class/net/{d}/statistics/tx_bytes 2>/dev/null || echo 0")
                    })
                    .collect();
                let child = self
                    .ssh(h)
                    .arg(script.join("; "))
                    .stdin(Stdio::null())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::null())
                    .spawn();
                (h, child)
            })
            .collect();
        let mut out = vec![(0, 0); self.plan.links.len()];
        for (h, child) in children {
            let Ok(o) = child.and_then(|c| c.wait_with_output()) else {
                continue;
            };
            let text = String::from_utf8_lossy(&o.stdout);
            for ((l, side, _), line) in reads[h].iter().zip(text.lines()) {
                let v = line.trim().parse().unwrap_or(0);
                if *side == 0 {
                    out[*l].0 = v;
                } else {
                    out[*l].1 = v;
                }
            }
        }
        out
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        self.teardown();
    }
}

impl Fabric for Hosts {
    fn name(&self) -> &'static str {
        "ssh"
    }

    fn setup(&mut self, exp: &Experiment, dir: &Path) -> Result<(), LabError> {
        self.local_dir = dir.to_path_buf();
        self.node_names = exp.nodes.clone();
        for (i, l) in exp.links.iter().enumerate() {
            self.link_nodes.push((l.a, l.b));
            self.impair.push((
                l.delay.as_micros() as u64,
                l.loss,
                super::sim::mix(exp.seed, 1000 + i as u64),
            ));
        }
        let hosts = 0..self.plan.ssh.len();
        self.clocks = hosts
            .clone()
            .map(|h| self.clock(h))
            .collect::<Result<_, _>>()?;
        let text = serde_json::json!({
            "mode": if self.one_way() { "one-way" } else { "rtt" },
            "tolerance_ms": ONE_WAY_TOLERANCE_MS,
            "hosts": self.clocks,
        });
        let p = dir.join("clocks.json");
        std::fs::write(&p, format!("{text:#}\n")).map_err(|e| LabError::io(&p, e))?;
        let (files, stamp) = self.payload(dir)?;
        self.bin_dir = format!("{}/bin-{stamp}", self.plan.dir);
        for h in hosts {
            // Marked made first: a failure below still cleans up.
            self.made[h] = true;
            let b = &self.bin_dir;
            let have = self.on(
                h,
                &format!(
                    "mkdir -p {} && test -f {b}/.complete && echo yes || true",
                    self.run_dir
                ),
            )?;
            if have.trim() != "yes" {
                self.on(h, &format!("rm -rf {b} && mkdir -p {b}"))?;
                self.copy(h, &files, b)?;
                self.on(h, &format!("chmod +x {b}/* && touch {b}/.complete"))?;
            }
        }
        Ok(())
    }

    fn shim(&self, node: usize, link: usize) -> ShimKind {
        let side = usize::from(self.link_nodes[link].0 != node);
        match &self.plan.links[link] {
            LinkPlan::Udp(ends) => ShimKind::Udp {
                bind: ends[side],
                peer: ends[1 - side],
            },
            LinkPlan::Eth(ifs, vlan) => {
                let (delay_us, loss, seed) = self.impair[link];
                ShimKind::Eth {
                    interface: ifs[side].clone(),
                    vlan: *vlan,
                    delay_us,
                    loss,
                    seed: seed ^ side as u64,
                }
            }
        }
    }

    fn command(&self, node: usize, program: &Path) -> Command {
        let name = program
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut c = self.ssh(self.host(node));
        c.arg(format!(
            "exec sh {b}/ssh-wrap.sh {r} {b}/{name}",
            b = self.bin_dir,
            r = self.run_dir
        ));
        c
    }

    fn tool_command(&self, node: usize, program: &Path) -> Command {
        self.command(node, program)
    }

    fn socket(&self, node: usize) -> Option<PathBuf> {
        Some(PathBuf::from(format!(
            "{}/{}.sock",
            self.run_dir, self.node_names[node]
        )))
    }

    fn place_config(&mut self, node: usize, local: &Path) -> Result<PathBuf, LabError> {
        self.copy(self.host(node), &[local.to_path_buf()], &self.run_dir)?;
        let name = local.file_name().unwrap_or_default().to_string_lossy();
        Ok(PathBuf::from(format!("{}/{name}", self.run_dir)))
    }

    fn notes(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .clocks
            .iter()
            .map(|c| {
                format!(
                    "host {}: clock offset {:+.3} ms (± {:.3} ms)",
                    c.host,
                    c.offset_ms,
                    c.rtt_ms / 2.0
                )
            })
            .collect();
        v.push(if self.one_way() {
            format!("clocks within {ONE_WAY_TOLERANCE_MS} ms: one-way delays")
        } else {
            format!(
                "clocks not within {ONE_WAY_TOLERANCE_MS} ms: RTT mode (trust echo RTTs, not one-way delays)"
            )
        });
        v
    }

    fn traffic_starts(&self) {
        let fresh = self.refresh_counters();
        *self.counters.lock().unwrap_or_else(|p| p.into_inner()) = (fresh, true);
    }

    fn set_link(&self, link: usize, up: bool) -> Result<(), LabError> {
        let LinkPlan::Eth(ifs, _) = &self.plan.links[link] else {
            return Err(fail(format!(
                "link {link}: taking shim-udp links down is not supported over ssh"
            )));
        };
        let (a, b) = self.link_nodes[link];
        for (node, dev) in [(a, &ifs[0]), (b, &ifs[1])] {
            let st = if up { "up" } else { "down" };
            self.on(self.host(node), &format!("ip link set {dev} {st}"))?;
        }
        Ok(())
    }

    /// The run asks for every link in order, once as the traffic starts
    /// (read then, in [`Fabric::traffic_starts`]) and once as it ends: all
    /// links are read at once when link 0 is asked for and the last read
    /// was used up.
    fn link_counters(&self, link: usize) -> (u64, u64, u64) {
        let mut c = self.counters.lock().unwrap_or_else(|p| p.into_inner());
        if link == 0 && !c.1 {
            c.0 = self.refresh_counters();
        }
        c.1 = link + 1 < self.plan.links.len();
        let (ab, ba) = c.0.get(link).copied().unwrap_or((0, 0));
        (ab, ba, 0)
    }

    fn traffic_ended(&mut self) {
        let dir = self.local_dir.join("counters");
        if std::fs::create_dir_all(&dir).is_err() {
            return;
        }
        let rinactl = self.bins.tools.join("rinactl");
        for n in 0..self.node_names.len() {
            for what in ["ipcps", "flows"] {
                let Some(sock) = self.socket(n) else { continue };
                let out = self
                    .tool_command(n, &rinactl)
                    .arg("--socket")
                    .arg(sock)
                    .arg("--json")
                    .arg(what)
                    .stdin(Stdio::null())
                    .output();
                save_counters(&dir, &format!("{}-{what}", self.node_names[n]), out);
            }
        }
    }

    fn teardown(&mut self) {
        for h in 0..self.made.len() {
            if std::mem::take(&mut self.made[h]) {
                self.clean(h);
            }
        }
    }
}

/// Saves the output of one `rinactl --json` in `dir` as `<stem>.json`, or,
/// if it failed (the host or its `rinad` gone), says why in `<stem>.error`
/// rather than leaving an empty or partial `.json` behind.
fn save_counters(dir: &Path, stem: &str, out: std::io::Result<std::process::Output>) {
    let (name, text) = match out {
        Ok(o) if o.status.success() => (format!("{stem}.json"), o.stdout),
        Ok(o) => {
            let mut t = format!("rinactl over ssh failed ({}): ", o.status).into_bytes();
            t.extend(o.stderr);
            (format!("{stem}.error"), t)
        }
        Err(e) => (
            format!("{stem}.error"),
            format!("cannot run ssh: {e}\n").into_bytes(),
        ),
    };
    let _ = std::fs::write(dir.join(name), text);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_of_a_host_that_is_gone_are_an_error_file_not_empty_json() {
        use std::os::unix::process::ExitStatusExt;
        let dir = std::env::temp_dir().join(format!("rl-counters-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let out = |code: i32, stdout: &str, stderr: &str| {
            Ok(std::process::Output {
                status: std::process::ExitStatus::from_raw(code << 8),
                stdout: stdout.into(),
                stderr: stderr.into(),
            })
        };
        save_counters(&dir, "a-flows", out(0, "[]\n", ""));
        let lost = "ssh: connect to host 10.0.0.2 port 22: No route to host\n";
        save_counters(&dir, "b-flows", out(255, "", lost));
        let read = |f: &str| std::fs::read_to_string(dir.join(f)).ok();
        assert_eq!(read("a-flows.json").as_deref(), Some("[]\n"));
        assert_eq!(read("b-flows.json"), None);
        let err = read("b-flows.error").unwrap();
        assert!(
            err.contains("255") && err.contains("No route to host"),
            "{err}"
        );
        let _ = std::fs::remove_dir_all(dir);
    }

    const EXP: &str = r#"
nodes = ["a", "b", "c"]
[experiment]
name = "t"
duration = "2s"
[[link]]
between = ["a", "b"]
[[link]]
between = ["b", "c"]
"#;

    fn exp() -> Experiment {
        crate::load(EXP, None).expect("test experiment")
    }

    #[test]
    fn links_default_to_shim_udp_between_host_addresses() {
        let inv = Inventory::parse(
            r#"
user = "root"
[[host]]
name = "h1"
address = "10.0.0.1"
nodes = ["a", "b"]
[[host]]
name = "h2"
address = "h2.example"
ip = "10.0.0.2"
port = 2222
nodes = ["c"]
"#,
        )
        .unwrap();
        let plan = Plan::new(&inv, &exp()).unwrap();
        assert_eq!(plan.node_host, vec![0, 0, 1]);
        assert_eq!(
            plan.links[1],
            LinkPlan::Udp([
                "10.0.0.1:47002".parse().unwrap(),
                "10.0.0.2:47003".parse().unwrap()
            ])
        );
        // Two nodes on one host: distinct ports.
        assert_eq!(
            plan.links[0],
            LinkPlan::Udp([
                "10.0.0.1:47000".parse().unwrap(),
                "10.0.0.1:47001".parse().unwrap()
            ])
        );
        assert!(plan.ssh[1].ends_with(&["-p".into(), "2222".into(), "root@h2.example".into()]));
    }

    #[test]
    fn links_can_be_mapped_to_interfaces_or_addresses() {
        let inv = Inventory::parse(
            r#"
[[host]]
name = "h1"
address = "h1"
nodes = ["a", "b", "c"]
[link."a--b"]
eth = { a = "eth1", b = "eth2" }
vlan = 300
[link."b--c"]
udp = { b = "192.168.1.2", c = "192.168.1.3:5000" }
"#,
        )
        .unwrap();
        let plan = Plan::new(&inv, &exp()).unwrap();
        assert_eq!(
            plan.links[0],
            LinkPlan::Eth(["eth1".into(), "eth2".into()], 300)
        );
        assert_eq!(
            plan.links[1],
            LinkPlan::Udp([
                "192.168.1.2:47002".parse().unwrap(),
                "192.168.1.3:5000".parse().unwrap()
            ])
        );
    }

    /// Nodes `a` and `b` with `n` links `l0`, `l1`, ... between them.
    fn exp_with_links(n: usize) -> Experiment {
        use std::fmt::Write as _;
        let mut t = String::from(
            "nodes = [\"a\", \"b\"]\n[experiment]\nname = \"many\"\nduration = \"1s\"\n",
        );
        for i in 0..n {
            let _ = write!(t, "[[link]]\nname = \"l{i}\"\nbetween = [\"a\", \"b\"]\n");
        }
        crate::load(&t, None).expect("experiment")
    }

    const ONE_HOST: &str =
        "[[host]]\nname = \"h\"\naddress = \"10.0.0.1\"\nnodes = [\"a\", \"b\"]\n";

    /// The error of a plan that must be refused (without printing the
    /// plan, thousands of links, if it was not).
    fn refused(r: Result<Plan, InventoryError>, what: &str) -> InventoryError {
        match r {
            Err(e) => e,
            Ok(_) => panic!("{what}, yet it was planned"),
        }
    }

    #[test]
    fn default_udp_ports_are_distinct_or_refused_naming_udp_port() {
        let inv = Inventory::parse(&format!("udp_port = 65000\n{ONE_HOST}")).unwrap();
        // Links 0..=267 take 65000..=65535: all there is.
        let plan = Plan::new(&inv, &exp_with_links(268)).unwrap();
        let mut ends = std::collections::HashSet::new();
        for l in &plan.links {
            let LinkPlan::Udp(a) = l else {
                panic!("{l:?} is not shim-udp")
            };
            assert!(ends.insert(a[0]) && ends.insert(a[1]), "{a:?} taken twice");
        }
        assert_eq!(ends.len(), 2 * 268);
        assert!(ends.contains(&"10.0.0.1:65535".parse().unwrap()));
        // One more link has no port left (its ends both got 65535).
        let e = refused(
            Plan::new(&inv, &exp_with_links(300)),
            "link 268 has no ports left",
        );
        assert!(
            matches!(&e, InventoryError::UdpPortRange { link, index: 268, udp_port: 65000 } if link == "l268"),
            "{e:?}"
        );
        assert!(e.to_string().contains("udp_port 65000"), "{e}");
        // Unless the links past the range are given their ports.
        let mut text = format!("udp_port = 65000\n{ONE_HOST}");
        for i in 268..300 {
            text += &format!(
                "[link.l{i}]\nudp = {{ a = \"10.0.0.1:{}\", b = \"10.0.0.1:{}\" }}\n",
                2 * i,
                2 * i + 1
            );
        }
        let plan = Plan::new(&Inventory::parse(&text).unwrap(), &exp_with_links(300)).unwrap();
        assert_eq!(
            plan.links[299],
            LinkPlan::Udp([
                "10.0.0.1:598".parse().unwrap(),
                "10.0.0.1:599".parse().unwrap()
            ])
        );
    }

    #[test]
    fn more_links_than_u16_ports_are_refused_not_a_panic() {
        // 2 × 32,768 overflowed u16: a panic, or link 0's ports again.
        let inv = Inventory::parse(ONE_HOST).unwrap();
        let e = refused(
            Plan::new(&inv, &exp_with_links(32_769)),
            "links past port 65535",
        );
        assert!(
            matches!(
                &e,
                InventoryError::UdpPortRange {
                    index: 9268,
                    udp_port: 47000,
                    ..
                }
            ),
            "{e:?}"
        );
    }

    #[test]
    fn shim_eth_vlans_past_4094_are_refused() {
        let exp = exp_with_links(4086);
        let eth = |i: usize, vlan: &str| {
            format!("[link.l{i}]\neth = {{ a = \"eth1\", b = \"eth2\" }}\n{vlan}")
        };
        let plan = |text: String| Plan::new(&Inventory::parse(&text).unwrap(), &exp);
        // 10 + 4084 is the last VLAN id.
        let p = plan(format!("{ONE_HOST}{}", eth(4084, ""))).unwrap();
        assert_eq!(
            p.links[4084],
            LinkPlan::Eth(["eth1".into(), "eth2".into()], 4094)
        );
        // 10 + 4085 is not a VLAN id (it was given as 4095).
        let e = refused(plan(format!("{ONE_HOST}{}", eth(4085, ""))), "VLAN 4095");
        assert!(
            matches!(&e, InventoryError::BadLink { link, what } if link == "l4085" && what.contains("VLAN")),
            "{e:?}"
        );
        let p = plan(format!("{ONE_HOST}{}", eth(4085, "vlan = 7\n"))).unwrap();
        assert_eq!(
            p.links[4085],
            LinkPlan::Eth(["eth1".into(), "eth2".into()], 7)
        );
        for bad in ["0", "4095", "65535"] {
            let e = refused(
                plan(format!("{ONE_HOST}{}", eth(3, &format!("vlan = {bad}\n")))),
                "a bad VLAN",
            );
            assert!(
                matches!(&e, InventoryError::BadLink { link, what } if link == "l3" && what.contains(bad)),
                "vlan {bad}: {e:?}"
            );
        }
    }

    #[test]
    fn bad_inventories_are_refused_with_the_reason() {
        let e = exp();
        let check = |text: &str| Plan::new(&Inventory::parse(text).unwrap(), &e).unwrap_err();
        let host = "[[host]]\nname = \"h\"\naddress = \"10.0.0.1\"\n";
        assert!(matches!(
            check(&format!("{host}nodes = [\"a\", \"b\"]")),
            InventoryError::Unplaced(n) if n == "c"
        ));
        assert!(matches!(
            check(&format!("{host}nodes = [\"a\", \"b\", \"c\", \"x\"]")),
            InventoryError::UnknownNode { node, .. } if node == "x"
        ));
        assert!(matches!(
            check(&format!("{host}nodes = [\"a\", \"b\", \"c\"]\n{host}nodes = [\"a\"]")),
            InventoryError::TwicePlaced(n) if n == "a"
        ));
        assert!(matches!(
            check(&format!("{host}nodes = [\"a\", \"b\", \"c\"]\n[link.\"a--c\"]\neth = {{ a = \"e\", c = \"e\" }}")),
            InventoryError::UnknownLink(_)
        ));
        assert!(matches!(
            check(&format!(
                "{host}nodes = [\"a\", \"b\", \"c\"]\n[link.\"a--b\"]\neth = {{ a = \"e\" }}"
            )),
            InventoryError::BadLink { .. }
        ));
        assert!(matches!(
            check(&format!("{host}nodes = [\"a\", \"b\", \"c\"]\n[link.\"a--b\"]\neth = {{ a = \"e; rm\", b = \"e\" }}")),
            InventoryError::Unsafe(_)
        ));
        assert!(matches!(
            check(&format!(
                "dir = \"tmp\"\n{host}nodes = [\"a\", \"b\", \"c\"]"
            )),
            InventoryError::RelativeDir(_)
        ));
        assert!(matches!(
            check("[[host]]\nname = \"h\"\naddress = \"h.example\"\nnodes = [\"a\", \"b\", \"c\"]"),
            InventoryError::NoIp(_)
        ));
        assert!(matches!(
            Inventory::parse("[[host]]\nname = 1"),
            Err(InventoryError::Parse(_))
        ));
    }
}
