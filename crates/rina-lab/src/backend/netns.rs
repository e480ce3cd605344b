//! The `netns` backend: a network namespace per node, a veth pair per
//! link, shim-eth on a VLAN per link (VLAN 10 + the link's index); root.
//!
//! - Rate: `tc qdisc ... tbf` on both ends of the veth pair (burst: 1 ms of
//!   traffic, at least two frames; limit: the link's queue of full frames).
//! - Delay and loss: in user space, in `rinad`'s shim-eth transmit path
//!   (`tx_delay_us`, `tx_loss`, `tx_seed`; there is no netem here). Unlike
//!   the `local` backend the loss applies from the start, enrollment
//!   included.
//! - Link down/up: `ip link set ... down/up` on both ends.
//! - Names: namespaces `rlab<pid>-<node index>`, veth ends
//!   `rl<pid>a<link>` and `rl<pid>b<link>`. Everything is removed when the
//!   run ends (also on error, panic or Ctrl-C), and a run first removes
//!   what runs of processes that no longer exist left behind (a crash).
//!
//! `rinad` runs inside each namespace (`ip netns exec`); its control
//! socket is a file, so the tools run outside and reach it by path. The
//! rest is [`super::real::run`].

use super::real::{self, Fabric, ShimKind};
use super::{Backend, RunCtx};
use crate::resolve::UNLIMITED_BPS;
use crate::results::RunOutput;
use crate::{Experiment, LabError};
use std::path::Path;
use std::process::{Command, Stdio};

/// The `netns` backend.
#[derive(Debug, Default)]
pub struct Netns {}

fn is_root() -> bool {
    // The effective uid, from /proc (no libc here).
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|u| u == "0"))
        })
        .unwrap_or(false)
}

fn have(tool: &str) -> bool {
    Command::new(tool)
        .arg("-V")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

impl Backend for Netns {
    fn name(&self) -> &'static str {
        "netns"
    }

    fn check(&self) -> Result<(), LabError> {
        if !is_root() {
            return Err(LabError::Unsupported {
                backend: "netns",
                reason: "needs root (network namespaces, veth pairs, tc and raw sockets); \
                         run as root, or use the `local` backend"
                    .into(),
            });
        }
        for t in ["ip", "tc"] {
            if !have(t) {
                return Err(LabError::Unsupported {
                    backend: "netns",
                    reason: format!("`{t}` (iproute2) is not installed"),
                });
            }
        }
        real::Bins::find("netns").map(|_| ())
    }

    fn run_once(&mut self, exp: &Experiment, ctx: &RunCtx<'_>) -> Result<RunOutput, LabError> {
        self.check()?;
        // Names are made from the pid: one netns run at a time per process
        // (tests run in threads of one process).
        let _one_at_a_time = NETNS_RUNS.lock().unwrap_or_else(|p| p.into_inner());
        remove_leftovers();
        let mut fabric = Namespaces::new();
        real::run(exp, ctx, &mut fabric)
    }
}

/// Held for the whole of a netns run (see `run_once`).
static NETNS_RUNS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The namespaces this process's runs have left (none unless a run failed
/// to clean up). Taken between runs, under the lock they hold: a run of
/// another thread of the process cannot be mistaken for a leftover.
pub fn namespaces_left() -> Vec<String> {
    let _between_runs = NETNS_RUNS.lock().unwrap_or_else(|p| p.into_inner());
    let mine = format!("rlab{}-", std::process::id());
    Command::new("ip")
        .args(["netns", "list"])
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .filter_map(|l| l.split_whitespace().next())
                .filter(|n| n.starts_with(&mine))
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// Runs a command, its failure an error naming it.
fn sh(args: &[&str]) -> Result<(), LabError> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| LabError::Backend {
            backend: "netns",
            what: format!("{}: {e}", args.join(" ")),
        })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(LabError::Backend {
            backend: "netns",
            what: format!(
                "`{}` failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        })
    }
}

/// Runs a command, ignoring the outcome (cleanup).
fn quiet(args: &[&str]) {
    let _ = Command::new(args[0])
        .args(&args[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// The pid in a name made by a run (`rlab<pid>-...` or `rl<pid>a...`).
fn owner_pid(name: &str) -> Option<u32> {
    let rest = name
        .strip_prefix("rlab")
        .or_else(|| name.strip_prefix("rl"))?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    let after = rest[digits.len()..].chars().next()?;
    if !matches!(after, '-' | 'a' | 'b') {
        return None;
    }
    digits.parse().ok()
}

/// Removes the namespaces and veths of runs whose process is gone.
pub fn remove_leftovers() {
    let dead = |pid: u32| !Path::new(&format!("/proc/{pid}")).exists();
    if let Ok(o) = Command::new("ip").args(["netns", "list"]).output() {
        for line in String::from_utf8_lossy(&o.stdout).lines() {
            let name = line.split_whitespace().next().unwrap_or("");
            if name.starts_with("rlab") && owner_pid(name).is_some_and(dead) {
                quiet(&["ip", "netns", "del", name]);
            }
        }
    }
    if let Ok(o) = Command::new("ip").args(["-o", "link", "show"]).output() {
        for line in String::from_utf8_lossy(&o.stdout).lines() {
            // "12: rl123a0@rl123b0: <...>"
            let Some(name) = line.split(": ").nth(1) else {
                continue;
            };
            let name = name.split('@').next().unwrap_or("");
            if name.starts_with("rl") && owner_pid(name).is_some_and(dead) {
                quiet(&["ip", "link", "del", name]);
            }
        }
    }
}

/// Namespaces and veth pairs of one run.
struct Namespaces {
    pid: u32,
    nodes: usize,
    /// Per link: (namespace, interface) of end A and of end B.
    ends: Vec<[(String, String); 2]>,
    /// Per link: end nodes.
    link_nodes: Vec<(usize, usize)>,
    /// Per link: (delay µs, loss, seed).
    impair: Vec<(u64, f64, u64)>,
    made: bool,
}

impl Namespaces {
    fn new() -> Self {
        Namespaces {
            pid: std::process::id(),
            nodes: 0,
            ends: Vec::new(),
            link_nodes: Vec::new(),
            impair: Vec::new(),
            made: false,
        }
    }

    fn ns(&self, node: usize) -> String {
        format!("rlab{}-{node}", self.pid)
    }

    fn counter(&self, ns: &str, dev: &str) -> u64 {
        Command::new("ip")
            .args(["netns", "exec", ns, "cat"])
            .arg(format!("/sys/class/net/{dev}/statistics/tx_bytes"))
            .stderr(Stdio::null())
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        self.teardown();
    }
}

impl Fabric for Namespaces {
    fn name(&self) -> &'static str {
        "netns"
    }

    fn setup(&mut self, exp: &Experiment, _dir: &Path) -> Result<(), LabError> {
        self.made = true;
        self.nodes = exp.nodes.len();
        for n in 0..exp.nodes.len() {
            let ns = self.ns(n);
            quiet(&["ip", "netns", "del", &ns]);
            sh(&["ip", "netns", "add", &ns])?;
            sh(&["ip", "-n", &ns, "link", "set", "lo", "up"])?;
        }
        if exp.links.len() > 4000 {
            return Err(LabError::Unsupported {
                backend: "netns",
                reason: "more than 4000 links (one VLAN each)".into(),
            });
        }
        // shim-eth delays its frames in the sender for at most 1 s
        // (rinad's `tx_delay_us`, bounded by its MAX_TX_DELAY_US).
        if let Some(l) = exp
            .links
            .iter()
            .find(|l| l.delay > std::time::Duration::from_secs(1))
        {
            return Err(LabError::Unsupported {
                backend: "netns",
                reason: format!(
                    "link {} has a delay of {:?}; shim-eth delays frames by at most 1 s \
                     (the local and sim backends take longer delays)",
                    l.name, l.delay
                ),
            });
        }
        for (i, l) in exp.links.iter().enumerate() {
            let a = format!("rl{}a{i}", self.pid);
            let b = format!("rl{}b{i}", self.pid);
            let (na, nb) = (self.ns(l.a), self.ns(l.b));
            sh(&["ip", "link", "add", &a, "type", "veth", "peer", "name", &b])?;
            sh(&["ip", "link", "set", &a, "netns", &na])?;
            sh(&["ip", "link", "set", &b, "netns", &nb])?;
            for (ns, dev) in [(&na, &a), (&nb, &b)] {
                sh(&["ip", "-n", ns, "link", "set", dev, "up"])?;
                if l.rate_bps < UNLIMITED_BPS {
                    let burst = ((l.rate_bps / 8.0 * 1e-3) as u64).max(2 * 1600);
                    let limit = (l.queue as u64 * 1600).max(burst);
                    sh(&[
                        "tc",
                        "-n",
                        ns,
                        "qdisc",
                        "add",
                        "dev",
                        dev,
                        "root",
                        "tbf",
                        "rate",
                        &format!("{}bit", l.rate_bps as u64),
                        "burst",
                        &format!("{burst}b"),
                        "limit",
                        &format!("{limit}b"),
                    ])?;
                }
            }
            self.ends.push([(na, a), (nb, b)]);
            self.link_nodes.push((l.a, l.b));
            self.impair.push((
                l.delay.as_micros() as u64,
                l.loss,
                super::sim::mix(exp.seed, 1000 + i as u64),
            ));
        }
        Ok(())
    }

    fn shim(&self, node: usize, link: usize) -> ShimKind {
        let side = usize::from(self.link_nodes[link].0 != node);
        let (delay_us, loss, seed) = self.impair[link];
        ShimKind::Eth {
            interface: self.ends[link][side].1.clone(),
            vlan: 10 + link as u16,
            delay_us,
            loss,
            seed: seed ^ side as u64,
        }
    }

    fn command(&self, node: usize, program: &Path) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec"]).arg(self.ns(node)).arg(program);
        c
    }

    fn traffic_starts(&self) {}

    fn set_link(&self, link: usize, up: bool) -> Result<(), LabError> {
        for (ns, dev) in &self.ends[link] {
            sh(&[
                "ip",
                "-n",
                ns,
                "link",
                "set",
                dev,
                if up { "up" } else { "down" },
            ])?;
        }
        Ok(())
    }

    fn link_counters(&self, link: usize) -> (u64, u64, u64) {
        let [(na, a), (nb, b)] = &self.ends[link];
        (self.counter(na, a), self.counter(nb, b), 0)
    }

    fn teardown(&mut self) {
        if !self.made {
            return;
        }
        self.made = false;
        // Deleting a namespace deletes the veth ends in it.
        for n in 0..self.nodes {
            quiet(&["ip", "netns", "del", &self.ns(n)]);
        }
        for [(_, a), _] in &self.ends {
            quiet(&["ip", "link", "del", a]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leftover_names_carry_their_pid() {
        assert_eq!(owner_pid("rlab1234-0"), Some(1234));
        assert_eq!(owner_pid("rl99a3"), Some(99));
        assert_eq!(owner_pid("rl99b12"), Some(99));
        assert_eq!(owner_pid("rlab-x"), None);
        assert_eq!(owner_pid("rlx"), None);
        assert_eq!(owner_pid("eth0"), None);
    }
}
