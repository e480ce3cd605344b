//! `rinactl reload` and SIGHUP: the configuration file read again and the
//! difference with the running system applied. The whole file is parsed
//! and checked before anything changes, so a bad file changes nothing.
//!
//! The `[system]` table is applied first: administrators (`admin_group`,
//! looked up again, and the connections open are judged again), the limits
//! per user, the idle timeout, the socket's mode and group and busy
//! polling; a `name` or `socket` that changed is reported as taking effect
//! at the next start.
//!
//! An IPCP is matched by name. One the file no longer has is destroyed; a
//! new one is created; one whose keys changed other than its neighbours,
//! static directory (`names`), scheduling policy, the EFCP policies and
//! keepalive (`keepalive_ms`) of its cubes, its DIF's access rules
//! (`access`) and the RIB subtrees members may read (`rib_readable`) of a
//! normal IPCP, or the `directory`, `peers_only` and `keepalive_ms` of a
//! shim-udp IPCP, is destroyed and created again; for the rest only those
//! change. A shim-udp IPCP's flows up keep their peer whatever its new
//! directory says, and its liveness check starts afresh. New access
//! rules judge new registrations and flows; the names registered and the
//! flows up stay. New EFCP policies are for new flows; a new keepalive is
//! for the cube's flows up as well
//! (`rina_core::normal::NormalIpcp::set_cube_keepalive` decides how).

use super::*;
use crate::config::{Config, IpcpConfig, IpcpKind, System};
use rina_core::system::NeighborSpec;

fn invalid(m: String) -> CtlError {
    CtlError::new(ErrorKind::InvalidRequest, m)
}

/// The keys of an `[[ipcp]]` table that change in place: a normal IPCP's
/// first five, a shim-udp IPCP's last three.
const IN_PLACE: [&str; 8] = [
    "neighbor",
    "names",
    "scheduler",
    "access",
    "rib_readable",
    "directory",
    "peers_only",
    "keepalive_ms",
];

/// The keys of a `[[ipcp.qos_cube]]` table that change in place.
const CUBE_IN_PLACE: [&str; 2] = ["efcp", "keepalive_ms"];

/// Table `t` without the keys that change in place, and without those of
/// its cubes: what must be equal to keep the IPCP.
fn identity(t: &toml::Table) -> toml::Table {
    let mut t = t.clone();
    for k in IN_PLACE {
        t.remove(k);
    }
    if let Some(toml::Value::Array(cubes)) = t.get_mut("qos_cube") {
        for c in cubes.iter_mut() {
            if let toml::Value::Table(c) = c {
                for k in CUBE_IN_PLACE {
                    c.remove(k);
                }
            }
        }
    }
    t
}

/// The keys whose values differ between `[[ipcp]]` tables `a` and `b`,
/// beyond those that change in place; empty when the IPCP is kept.
fn changed_keys(a: &toml::Table, b: &toml::Table) -> Vec<String> {
    let (a, b) = (identity(a), identity(b));
    let mut keys: Vec<String> = a
        .keys()
        .chain(b.keys())
        .filter(|k| a.get(*k) != b.get(*k))
        .cloned()
        .collect();
    keys.sort();
    keys.dedup();
    keys
}

/// The keys of a `[system]` table with the values the daemon takes from
/// them, to tell what a reload changes.
fn system_keys(s: &System) -> [(&'static str, String); 9] {
    let or = |v: Option<String>, d: &str| v.unwrap_or_else(|| d.to_string());
    [
        ("name", s.name.clone()),
        (
            "socket",
            or(
                s.socket.as_ref().map(|p| p.display().to_string()),
                "(default)",
            ),
        ),
        ("admin_group", or(s.admin_group.clone(), "(none)")),
        ("socket_mode", format!("0o{:o}", s.socket_mode())),
        ("socket_group", or(s.socket_group.clone(), "(none)")),
        ("max_conns_per_user", s.conns_per_user().to_string()),
        (
            "max_flows_per_user",
            or(
                s.max_flows_per_user
                    .as_ref()
                    .map(|m| m.get_ref().to_string()),
                "(default)",
            ),
        ),
        ("idle_timeout_ms", s.idle_timeout().as_millis().to_string()),
        (
            "busy_poll_us",
            s.busy_poll().map_or(0, |d| d.as_micros()).to_string(),
        ),
    ]
}

/// Keys of `[system]` that only a new start of the daemon changes.
const AT_RESTART: [&str; 2] = ["name", "socket"];

impl Daemon {
    /// Reads the configuration file (`path`, default the one the daemon
    /// started with, whatever was reloaded since) and
    /// applies the difference; what changed, one line each. A file named
    /// by the client of `conn` is read only if that client's user may read
    /// it: the daemon reads with its own rights, and its messages quote
    /// the file.
    pub(super) fn reload(
        &mut self,
        conn: Option<usize>,
        path: Option<&str>,
    ) -> Result<Vec<String>, CtlError> {
        let asker = match (conn, path) {
            (Some(c), Some(_)) => self.conns.get(&c).map(|c| c.cred.clone()),
            _ => None,
        };
        let path = path.map_or_else(|| self.config_path.clone(), PathBuf::from);
        let cfg = Config::load_with(&path, |m| match &asker {
            Some(cred) if !cred.may_read(m) => Err(format!("uid {} may not read it", cred.uid)),
            _ => Ok(()),
        })
        .map_err(|e| invalid(format!("configuration refused, nothing changed: {e}")))?;
        let mut out = Vec::new();
        if let Err(e) = self.apply(&cfg, &mut out) {
            let message = if out.is_empty() {
                format!("configuration not applied, nothing changed: {}", e.message)
            } else {
                format!(
                    "configuration applied only in part: {}\nchanged before the failure:\n  {}",
                    e.message,
                    out.join("\n  ")
                )
            };
            tracing::warn!(changes = out.len(), error = %e.message, "reload failed");
            return Err(CtlError::new(e.kind, message));
        }
        // `config_path` stays the file rinad started with: a FILE a client
        // named was checked against that client's rights only now, and
        // must not become what later reloads read with the daemon's.
        if out.is_empty() {
            out.push("nothing changed".into());
        }
        info!(changes = out.len(), "configuration reloaded");
        Ok(out)
    }

    /// Brings the running system to configuration `cfg` (checked), one
    /// line per change in `out`; on an error, `out` holds what had changed.
    fn apply(&mut self, cfg: &Config, out: &mut Vec<String>) -> Result<(), CtlError> {
        self.apply_system(&cfg.system, out)?;
        // Gone, or changed beyond what changes in place (created again).
        // (the IPCP, the keys that changed if it is created again)
        let mut destroy: Vec<(usize, Option<Vec<String>>)> = Vec::new();
        for i in self.live_ipcps() {
            let name = &self.ipcps[i].name;
            match cfg.ipcps.iter().find(|ic| ic.name.get_ref() == name) {
                None => destroy.push((i, None)),
                Some(ic) => {
                    let keys = changed_keys(&self.ipcps[i].cfg.raw, &ic.raw);
                    if !keys.is_empty() {
                        destroy.push((i, Some(keys)));
                    }
                }
            }
        }
        // What to create, in the file's creation order (shims, then normal
        // IPCPs in stacking order, the file's new IPCPs counted), decided
        // before anything is destroyed.
        let create: Vec<usize> = cfg
            .creation_order()
            .into_iter()
            .filter(|&k| {
                let name = cfg.ipcps[k].name.get_ref();
                self.live_named(name).is_err()
                    || destroy.iter().any(|&(i, _)| &self.ipcps[i].name == name)
            })
            .collect();
        for (i, again) in destroy {
            if let Some(keys) = again {
                out.push(format!(
                    "IPCP {} changed ({}): created again",
                    self.ipcps[i].name,
                    keys.join(", ")
                ));
            }
            out.extend(self.destroy_ipcp(i)?);
        }
        for k in create {
            out.extend(self.create_ipcp(&cfg.ipcps[k])?);
        }
        for ic in &cfg.ipcps {
            let i = self.live_named(ic.name.get_ref())?;
            match ic.kind {
                IpcpKind::Normal => self.update_in_place(i, ic, out)?,
                IpcpKind::ShimUdp => out.extend(self.update_udp_in_place(i, ic)),
                _ => {}
            }
            self.ipcps[i].cfg = ic.clone();
        }
        Ok(())
    }

    /// Puts `[system]` table `new` in force, one line per changed key in
    /// `out`. Fails, having changed nothing, if its `admin_group` names no
    /// group or the socket's mode or group cannot be set.
    fn apply_system(&mut self, new: &System, out: &mut Vec<String>) -> Result<(), CtlError> {
        let fresh =
            access::Access::new(new).map_err(|e| invalid(format!("[system] admin_group: {e}")))?;
        let old = system_keys(&self.system_cfg);
        let changed: Vec<usize> = system_keys(new)
            .iter()
            .zip(&old)
            .enumerate()
            .filter(|(_, (n, o))| n.1 != o.1)
            .map(|(k, _)| k)
            .collect();
        let socket_keys = ["socket_mode", "socket_group"];
        if changed.iter().any(|&k| socket_keys.contains(&old[k].0)) {
            // No socket_group: the daemon's own group again.
            let own_group = || {
                let gid = nix::unistd::getegid().as_raw();
                std::os::unix::fs::chown(&self.socket_path, None, Some(gid))
            };
            sys::set_socket_access(
                &self.socket_path,
                new.socket_mode(),
                new.socket_group.as_deref(),
            )
            .and_then(|()| match new.socket_group {
                Some(_) => Ok(()),
                None => own_group(),
            })
            .map_err(|e| {
                invalid(format!(
                    "[system] socket_mode, socket_group: cannot set them on {}: {e}",
                    self.socket_path.display()
                ))
            })?;
        }
        // Administrators are judged again, the connections open included:
        // a reload is how one takes the right away.
        self.access.replace(fresh, new);
        for c in self.conns.values_mut() {
            c.admin = self.access.is_admin(&c.cred);
        }
        self.busy = busy_poll::BusyPoll::new(new.busy_poll());
        let new_keys = system_keys(new);
        for k in changed {
            let ((key, was), (_, now)) = (&old[k], &new_keys[k]);
            let when = if AT_RESTART.contains(key) {
                " (when rinad starts again)"
            } else {
                ""
            };
            out.push(format!("[system] {key}: {was} -> {now}{when}"));
        }
        let (name, socket) = (self.system_cfg.name.clone(), self.system_cfg.socket.clone());
        self.system_cfg = System {
            name,
            socket,
            ..new.clone()
        };
        Ok(())
    }

    /// Brings the neighbours, static directory, scheduling policy and
    /// cubes' EFCP policies and keepalive of normal IPCP `i` to what `ic`
    /// says, one line per change in `out`.
    fn update_in_place(
        &mut self,
        i: usize,
        ic: &IpcpConfig,
        out: &mut Vec<String>,
    ) -> Result<(), CtlError> {
        let name = ic.name.get_ref().clone();
        let now = self.now();
        let have: Vec<NeighborSpec> = self
            .sys
            .plan(i)
            .map(|p| p.neighbors.iter().map(|nb| nb.spec.clone()).collect())
            .unwrap_or_default();
        for nb in &have {
            let keep = ic
                .neighbors
                .iter()
                .any(|w| w.name == nb.name && w.over.get_ref() == &nb.over);
            if !keep && self.sys.remove_neighbor(now, i, &nb.name) {
                out.push(format!("{name}: neighbour {} removed", nb.name));
            }
        }
        for w in &ic.neighbors {
            let there = have
                .iter()
                .any(|nb| nb.name == w.name && &nb.over == w.over.get_ref());
            if !there {
                let (_, lower) = self.normal_and_lower(&name, w.over.get_ref())?;
                self.sys.register_ipcp(i, lower).map_err(ipcp::flow_error)?;
                let spec = NeighborSpec {
                    name: w.name.clone(),
                    over: w.over.get_ref().clone(),
                    address: w.address,
                };
                self.sys
                    .add_neighbor(now, i, spec)
                    .map_err(|e| invalid(e.to_string()))?;
                out.push(format!(
                    "{name}: neighbour {} added over {}",
                    w.name,
                    w.over.get_ref()
                ));
            }
        }
        out.extend(self.update_names(i, ic));
        let sched = ic.scheduler_config();
        let same = matches!(&self.ipcps[i].io, Io::Normal(n) if n.sched == sched);
        if !same {
            let v = serde_json::to_value(&sched).map_err(|e| invalid(e.to_string()))?;
            self.scheduler(&name, Some(v))?;
            out.push(format!("{name}: scheduling policy now {}", sched.name()));
        }
        out.extend(self.update_cubes(i, ic)?);
        out.extend(self.update_policies(i, ic));
        self.drain_outputs();
        Ok(())
    }

    /// The directory, `peers_only` and liveness check of shim-udp IPCP
    /// `i` as `ic` says; the flows up stay.
    fn update_udp_in_place(&mut self, i: usize, ic: &IpcpConfig) -> Vec<String> {
        let name = ic.name.get_ref().clone();
        let now = self.now();
        let old = &self.ipcps[i].cfg;
        let mut out = Vec::new();
        for (app, addr) in &old.directory {
            match ic.directory.get(app) {
                None => out.push(format!("{name}: directory entry {app} removed")),
                Some(a) if a != addr => out.push(format!("{name}: {app} is at {a}")),
                Some(_) => {}
            }
        }
        for (app, a) in &ic.directory {
            if !old.directory.contains_key(app) {
                out.push(format!("{name}: {app} is at {a}"));
            }
        }
        let peers_only = ic.peers_only.unwrap_or(false);
        let (was, will) = (old.udp_keepalive(), ic.udp_keepalive());
        let Some(s) = self.sys.member_mut(i).and_then(|m| m.shim_udp_mut()) else {
            return Vec::new();
        };
        if !out.is_empty() {
            s.set_directory(ic.directory.clone().into_iter().collect());
        }
        if s.config().peers_only != peers_only {
            s.set_peers_only(peers_only);
            let whom = if peers_only {
                "only from the directory's addresses"
            } else {
                "from anyone"
            };
            out.push(format!("{name}: flow requests now taken {whom}"));
        }
        if was != will {
            s.set_keepalive(now, will);
            out.push(format!(
                "{name}: keepalive {} -> {} ({} flow(s) up checked afresh)",
                keepalive_text(was),
                keepalive_text(will),
                s.flows().count()
            ));
        }
        out
    }

    /// The access rules and the readable RIB subtrees of normal IPCP `i`
    /// as `ic` says.
    fn update_policies(&mut self, i: usize, ic: &IpcpConfig) -> Vec<String> {
        let name = ic.name.get_ref().clone();
        let mut out = Vec::new();
        let want = ic.normal_config();
        let Some(n) = self.sys.member_mut(i).and_then(|m| m.normal_mut()) else {
            return out;
        };
        if n.access() != &want.access {
            n.set_access(want.access);
            out.push(format!(
                "{name}: access rules changed (for new registrations and flows; those in place stay)"
            ));
        }
        if n.rib_readable() != want.rib_readable.as_slice() {
            let now = match want.rib_readable.as_slice() {
                [] => "nothing".to_string(),
                r => r.join(", "),
            };
            out.push(format!("{name}: RIB readable by members now {now}"));
            n.set_rib_readable(want.rib_readable);
        }
        out
    }

    /// The static directory of normal IPCP `i` as `ic` says.
    fn update_names(&mut self, i: usize, ic: &IpcpConfig) -> Vec<String> {
        let name = ic.name.get_ref().clone();
        let old = self.ipcps[i].cfg.names.clone();
        let mut out = Vec::new();
        let Some(n) = self.sys.member_mut(i).and_then(|m| m.normal_mut()) else {
            return out;
        };
        for app in old.keys().filter(|a| !ic.names.contains_key(*a)) {
            if n.remove_directory(app) {
                out.push(format!("{name}: directory entry {app} removed"));
            }
        }
        for (app, &addr) in &ic.names {
            if old.get(app) != Some(&addr) {
                n.set_directory(app.clone(), addr);
                out.push(format!("{name}: {app} is at address {addr}"));
            }
        }
        out
    }

    /// The EFCP policies and keepalive of the cubes of normal IPCP `i` as
    /// `ic` says.
    fn update_cubes(&mut self, i: usize, ic: &IpcpConfig) -> Result<Vec<String>, CtlError> {
        let name = ic.name.get_ref().clone();
        let now = self.now();
        let mut out = Vec::new();
        let Some(n) = self.sys.member_mut(i).and_then(|m| m.normal_mut()) else {
            return Ok(out);
        };
        for c in ic.cubes() {
            if n.cube(c.id).is_some_and(|have| have.efcp != c.efcp) {
                n.replace_cube_efcp(c.id, c.efcp)
                    .map_err(|e| invalid(format!("{name}: {e}")))?;
                out.push(format!(
                    "{name}: EFCP policies of QoS cube {} changed",
                    c.name
                ));
            }
            // By name, as enrollment keeps a member's own keepalive for the
            // DIF's cube of the same name.
            let running = n.config().cubes.iter().find(|r| r.name == c.name);
            let Some((id, was)) = running.map(|r| (r.id, r.keepalive)) else {
                continue;
            };
            if was != c.keepalive {
                let flows = n
                    .set_cube_keepalive(now, id, c.keepalive)
                    .map_err(|e| invalid(format!("{name}: {e}")))?;
                out.push(format!(
                    "{name}: keepalive of QoS cube {} {} -> {} ({flows} flow(s) up switched)",
                    c.name,
                    keepalive_text(was),
                    keepalive_text(c.keepalive)
                ));
            }
        }
        Ok(out)
    }
}

/// A keepalive period as a reload's report says it: `off` or `N ms`.
fn keepalive_text(k: Option<std::time::Duration>) -> String {
    k.map_or("off".into(), |d| format!("{} ms", d.as_millis()))
}
