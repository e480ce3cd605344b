//! Starting a run's programs: configurations, `rinad`s, servers and clients.

use super::{
    client_command, config, err, kind_tool, matrix, out_file, Bins, Fabric, Job, Procs, RunDirs,
    RunPlan, Server,
};
use crate::model::TrafficKind;
use crate::{Experiment, LabError};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::Duration;

/// The order the nodes' `rinad`s start in: the first DIF's enrollment
/// order, then the nodes it leaves out.
pub(super) fn start_order(exp: &Experiment) -> Vec<usize> {
    let mut order: Vec<usize> = exp
        .difs
        .first()
        .map(|d| d.enrollment_order.clone())
        .unwrap_or_default();
    for n in 0..exp.nodes.len() {
        if !order.contains(&n) {
            order.push(n);
        }
    }
    order
}

/// What starts a run's programs: the fabric, the binaries, the run's
/// folders, and each node's control socket and configuration.
pub(super) struct Launcher<'a> {
    pub(super) be: &'static str,
    pub(super) exp: &'a Experiment,
    pub(super) fab: &'a dyn Fabric,
    bins: &'a Bins,
    pub(super) dirs: &'a RunDirs,
    /// Each node's control socket.
    socks: Vec<PathBuf>,
    /// Where each node's `rinad` reads its configuration.
    conf_at: Vec<PathBuf>,
    /// Where each group's `rina-tgen` reads its traffic matrix.
    pub(super) matrix_at: Vec<PathBuf>,
    rinactl: PathBuf,
}

impl<'a> Launcher<'a> {
    /// Writes every node's configuration and every group's traffic matrix
    /// to `conf/` and places them where they are read (sockets not placed
    /// by the fabric go in `sock_dir`).
    pub(super) fn configure(
        be: &'static str,
        exp: &'a Experiment,
        fab: &'a mut dyn Fabric,
        bins: &'a Bins,
        dirs: &'a RunDirs,
        sock_dir: &Path,
        plan: &RunPlan,
    ) -> Result<Launcher<'a>, LabError> {
        let local_sock = |n: usize| sock_dir.join(format!("{n}.sock"));
        let socks: Vec<PathBuf> = (0..exp.nodes.len())
            .map(|n| fab.socket(n).unwrap_or_else(|| local_sock(n)))
            .collect();
        let mut conf_at: Vec<PathBuf> = Vec::new();
        for (n, apps) in plan.shim_apps.iter().enumerate() {
            let text = config::node_config(exp, n, &socks[n], &|l| fab.shim(n, l), apps);
            let p = dirs.confs.join(format!("{}.toml", exp.nodes[n]));
            std::fs::write(&p, text).map_err(|e| LabError::io(&p, e))?;
            conf_at.push(fab.place_config(n, &p)?);
        }
        let mut matrix_at: Vec<PathBuf> = Vec::new();
        for g in &plan.groups {
            let p = dirs.confs.join(format!("{}.toml", matrix::stem(exp, g)));
            std::fs::write(&p, matrix::matrix_text(exp, &plan.jobs, g))
                .map_err(|e| LabError::io(&p, e))?;
            matrix_at.push(fab.place_config(g.node, &p)?);
        }
        Ok(Launcher {
            be,
            exp,
            fab,
            bins,
            dirs,
            socks,
            conf_at,
            matrix_at,
            rinactl: bins.tool("rinactl"),
        })
    }

    /// Node `n`'s control socket.
    fn sock(&self, n: usize) -> &Path {
        &self.socks[n]
    }

    /// Starts node `n`'s `rinad`, its output appended to `logs/<node>.log`.
    pub(super) fn start_rinad(&self, procs: &mut Procs, n: usize) -> Result<(), LabError> {
        let exp = self.exp;
        let log = self.dirs.logs.join(format!("{}.log", exp.nodes[n]));
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(|e| LabError::io(&log, e))?;
        let file2 = file.try_clone().map_err(|e| LabError::io(&log, e))?;
        let _ = std::fs::remove_file(self.sock(n));
        let child = self
            .fab
            .command(n, &self.bins.rinad)
            .arg("--config")
            .arg(&self.conf_at[n])
            .arg("--socket")
            .arg(self.sock(n))
            .arg("--log-level")
            .arg("info")
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(file2)
            .spawn()
            .map_err(|e| err(self.be, format!("starting rinad for {}: {e}", exp.nodes[n])))?;
        procs.add(format!("rinad {n}"), child);
        Ok(())
    }

    /// How many of node `n`'s normal IPCPs have an address, as `rinactl`
    /// tells (0 if it cannot).
    pub(super) fn enrolled(&self, n: usize) -> usize {
        let Ok(o) = self
            .fab
            .tool_command(n, &self.rinactl)
            .arg("--socket")
            .arg(self.sock(n))
            .arg("--json")
            .arg("ipcps")
            .stderr(Stdio::null())
            .output()
        else {
            return 0;
        };
        let Ok(v) = serde_json::from_slice::<Vec<rina_wire::ctl::IpcpInfo>>(&o.stdout) else {
            return 0;
        };
        v.iter()
            .filter(|i| i.kind == "normal" && i.address != "0" && !i.address.is_empty())
            .count()
    }

    /// Whether node `n`'s `rinad` answers on its control socket.
    pub(super) fn answers(&self, n: usize) -> bool {
        self.fab
            .tool_command(n, &self.rinactl)
            .arg("--socket")
            .arg(self.sock(n))
            .arg("ipcps")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// Starts server `s`, its output in `logs/server-<name>-<dif>-<node>.log`.
    pub(super) fn start_server(&self, procs: &mut Procs, s: &Server) -> Result<(), LabError> {
        let log = self.dirs.logs.join(format!(
            "server-{}-{}-{}.log",
            s.name, s.dif, self.exp.nodes[s.node]
        ));
        let file = std::fs::File::create(&log).map_err(|e| LabError::io(&log, e))?;
        let file2 = file.try_clone().map_err(|e| LabError::io(&log, e))?;
        let mut c = self
            .fab
            .tool_command(s.node, &self.bins.tool(kind_tool(s.kind)));
        c.arg("server")
            .arg("--socket")
            .arg(self.sock(s.node))
            .arg("--dif")
            .arg(&s.dif)
            .arg("--name")
            .arg(&s.name);
        if s.kind == TrafficKind::Tgen {
            c.arg("--interval-s").arg("0");
        }
        let child = c
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(file2)
            .spawn()
            .map_err(|e| err(self.be, format!("starting {}: {e}", kind_tool(s.kind))))?;
        procs.add(s.proc_name(), child);
        Ok(())
    }

    /// Starts the servers of the run's start: each name at the place it
    /// starts at.
    pub(super) fn start_initial_servers(
        &self,
        procs: &mut Procs,
        servers: &[Server],
    ) -> Result<(), LabError> {
        let initial: Vec<Server> = servers
            .iter()
            .filter(|s| match s.app {
                Some(a) => self.exp.apps[a].node == s.node,
                None => true,
            })
            .cloned()
            .collect();
        for s in &initial {
            self.start_server(procs, s)?;
        }
        Ok(())
    }

    /// Spawns group `g`'s `rina-tgen` on its traffic matrix `file`, its
    /// report and stderr in `out/<stem>.json` and `out/<stem>.err`.
    pub(super) fn spawn_group(
        &self,
        jobs: &[Job],
        g: &matrix::Group,
        file: &Path,
    ) -> Result<Child, LabError> {
        let exp = self.exp;
        let outs = &self.dirs.outs;
        let stem = matrix::stem(exp, g);
        let tool = self.fab.tool_command(g.node, &self.bins.tool("rina-tgen"));
        matrix::command(tool, exp, jobs, g, self.sock(g.node), file)
            .stdin(Stdio::null())
            .stdout(out_file(outs, &stem, "json")?)
            .stderr(out_file(outs, &stem, "err")?)
            .spawn()
            .map_err(|e| err(self.be, format!("starting {}: {e}", g.proc)))
    }

    /// Spawns job `j`'s client at `now` (from the start of traffic), its
    /// report and stderr in `out/<id>.json` and `out/<id>.err`.
    pub(super) fn spawn_client(&self, j: &Job, now: Duration) -> Result<Child, LabError> {
        let exp = self.exp;
        let outs = &self.dirs.outs;
        let f = &exp.flows[j.flow];
        let tool = self
            .fab
            .tool_command(f.from, &self.bins.tool(kind_tool(f.kind)));
        client_command(tool, self.sock(f.from), f, j, now, exp)
            .stdin(Stdio::null())
            .stdout(out_file(outs, &j.id, "json")?)
            .stderr(out_file(outs, &j.id, "err")?)
            .spawn()
            .map_err(|e| err(self.be, format!("starting the client of {}: {e}", j.id)))
    }

    /// Every link's counters now (bytes A to B, B to A, frames dropped).
    pub(super) fn link_counters(&self) -> Vec<(u64, u64, u64)> {
        (0..self.exp.links.len())
            .map(|l| self.fab.link_counters(l))
            .collect()
    }
}
