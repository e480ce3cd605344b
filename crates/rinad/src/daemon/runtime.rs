//! Management at run time: creating and destroying IPCPs (with the same
//! keys and checks as the configuration file), enrolling a normal IPCP
//! through a named neighbour, and the EFCP policies of a DIF's QoS cubes.
//! Administrators only; every refusal says what and why. What to tear
//! down and how is the core's ([`System::remove_ipcp`]); this module does
//! the IO around it.

use super::*;
use crate::config::IpcpConfig;
use rina_core::normal::MembershipEvent;

/// Longest an enrollment asked for with `rinactl ipcp enroll` is waited
/// for, unless the request says otherwise.
const ENROLL_WAIT: Duration = Duration::from_secs(10);
/// Longest wait a request may ask for.
const ENROLL_WAIT_MAX: Duration = Duration::from_secs(120);

fn invalid(m: String) -> CtlError {
    CtlError::new(ErrorKind::InvalidRequest, m)
}

/// An enrollment a client waits for.
pub(super) struct PendingEnroll {
    /// The normal IPCP that enrolls.
    member: usize,
    conn: usize,
    id: u64,
    /// When it was asked for.
    since: Instant,
    /// When the client is answered with a timeout.
    deadline: Instant,
    /// The steps so far, for the reply.
    steps: Vec<String>,
}

impl PendingEnroll {
    /// The control connection waiting for it.
    pub(super) fn conn(&self) -> usize {
        self.conn
    }

    /// When the client is answered with a timeout.
    pub(super) fn deadline(&self) -> Instant {
        self.deadline
    }
}

impl Daemon {
    /// SIGHUP: the configuration file is read again; the outcome is logged.
    pub(super) fn on_hup(&mut self) {
        let mut b = [0u8; 16];
        while matches!(self.hup_rx.read(&mut b), Ok(n) if n > 0) {}
        match self.reload(None, None) {
            Ok(changes) => {
                for c in changes {
                    info!(change = %c, "SIGHUP: configuration reloaded");
                }
            }
            Err(e) => tracing::error!(error = %e.message, "SIGHUP: configuration refused"),
        }
    }

    /// Carries out run-time management operation `op` of request `id`;
    /// `None` when the answer comes later (an enrollment).
    pub(super) fn runtime_op(
        &mut self,
        conn: usize,
        id: u64,
        op: Op,
    ) -> Option<Result<Reply, CtlError>> {
        let what = match &op {
            Op::CreateIpcp { .. } => "creating an IPCP",
            Op::DestroyIpcp { .. } => "destroying an IPCP",
            Op::Enroll { .. } => "enrolling an IPCP",
            Op::SetEfcp { .. } => "changing a QoS cube's EFCP policies",
            _ => "reloading the configuration",
        };
        if let Err(e) = self.require_admin(conn, what) {
            return Some(Err(e));
        }
        let changes =
            |r: Result<Vec<String>, CtlError>| Some(r.map(|changes| Reply::Changes { changes }));
        match op {
            Op::CreateIpcp { config } => {
                let running = self.running_configs();
                let ic = crate::config::Config::parse_ipcp("ipcp create", &config, &running)
                    .map_err(|e| invalid(format!("IPCP refused: {e}")));
                changes(ic.and_then(|ic| self.create_ipcp(&ic)))
            }
            Op::DestroyIpcp { ipcp } => changes(self.destroy_named(&ipcp)),
            Op::Enroll {
                ipcp,
                neighbor,
                over,
                address,
                timeout_ms,
            } => {
                let wait = timeout_ms
                    .map_or(ENROLL_WAIT, Duration::from_millis)
                    .min(ENROLL_WAIT_MAX);
                match self.enroll(conn, id, &ipcp, neighbor, &over, address, wait) {
                    Ok(()) => None,
                    Err(e) => Some(Err(e)),
                }
            }
            Op::SetEfcp { ipcp, cube, set } => changes(self.set_efcp(&ipcp, &cube, set)),
            Op::Reload { path } => changes(self.reload(Some(conn), path.as_deref())),
            _ => Some(Err(invalid("not a management operation".into()))),
        }
    }

    /// The `[[ipcp]]` tables of the IPCPs that run.
    pub(super) fn running_configs(&self) -> Vec<IpcpConfig> {
        self.live_ipcps()
            .map(|i| self.ipcps[i].cfg.clone())
            .collect()
    }

    /// The indices of the IPCPs that were not destroyed.
    pub(super) fn live_ipcps(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.ipcps.len()).filter(|&i| !matches!(self.ipcps[i].io, Io::Removed))
    }

    /// The IPCP named `ipcp` that runs, by index.
    pub(super) fn live_named(&self, ipcp: &str) -> Result<usize, CtlError> {
        self.live_ipcps()
            .find(|&i| self.ipcps[i].name == ipcp)
            .ok_or_else(|| {
                let names: Vec<&str> = self
                    .live_ipcps()
                    .map(|i| self.ipcps[i].name.as_str())
                    .collect();
                invalid(format!(
                    "no IPCP named {ipcp:?}; this system has {}",
                    if names.is_empty() {
                        "none".to_string()
                    } else {
                        names.join(", ")
                    }
                ))
            })
    }

    /// Creates the IPCP of `ic` (checked already) with its driver.
    pub(super) fn create_ipcp(&mut self, ic: &IpcpConfig) -> Result<Vec<String>, CtlError> {
        let mut all = self.running_configs();
        all.push(ic.clone());
        let ip = build::add_one(&mut self.sys, &self.poll, ic, &all)
            .map_err(|e| invalid(format!("IPCP {} not created: {e}", ic.name.get_ref())))?;
        let line = format!(
            "IPCP {} created ({}, DIF {})",
            ip.name,
            self.sys.members().last().map_or("?", |m| m.kind()),
            ip.dif
        );
        info!(ipcp = %ip.name, dif = %ip.dif, "IPCP created at run time");
        self.ipcps.push(ip);
        self.drain_outputs();
        Ok(vec![line])
    }

    fn destroy_named(&mut self, ipcp: &str) -> Result<Vec<String>, CtlError> {
        let i = self.live_named(ipcp)?;
        self.destroy_ipcp(i)
    }

    /// Destroys IPCP `i` and what rests on it; the applications of its
    /// flows read end of file at once, the IPCPs above lose their N-1
    /// flows over it.
    pub(super) fn destroy_ipcp(&mut self, i: usize) -> Result<Vec<String>, CtlError> {
        let now = self.now();
        let name = self.ipcps[i].name.clone();
        let r = self
            .sys
            .remove_ipcp(now, i)
            .map_err(|e| invalid(e.to_string()))?;
        // The flows' descriptors close as the core's news is carried out.
        self.drain_outputs();
        // Its captures end: their readers read end of file.
        self.end_captures_of(i);
        self.owners.retain(|(m, _), _| *m != i);
        for c in self.conns.values_mut() {
            c.names.retain(|(m, _)| *m != i);
        }
        self.incoming.retain(|_, inc| inc.ipcp != i);
        let (gone, left): (Vec<_>, Vec<_>) = std::mem::take(&mut self.enrolls)
            .into_iter()
            .partition(|e| e.member == i);
        self.enrolls = left;
        for mut e in gone {
            e.steps.push(format!("IPCP {name} was destroyed"));
            self.answer_enroll(e, Err(ErrorKind::Refused));
        }
        // Reads of a neighbour's RIB under way: the machine that would
        // have answered them is gone.
        let reads: Vec<(usize, u64)> = self
            .rib_reads
            .keys()
            .filter(|(m, _)| *m == i)
            .copied()
            .collect();
        for (m, handle) in reads {
            let why = format!("IPCP {name} was destroyed while it read a neighbour's RIB");
            self.rib_read_done(m, handle, Err(CtlError::new(ErrorKind::Refused, why)));
        }
        let ports: Vec<PortId> = self
            .flows
            .iter()
            .filter(|(_, s)| s.ipcp == i)
            .map(|(&p, _)| p)
            .collect();
        for port in ports {
            self.close_flow(port, false);
        }
        // Its socket or rings close with its driver.
        let ip = &mut self.ipcps[i];
        ip.io = Io::Removed;
        ip.name = String::new();
        ip.dif = String::new();
        info!(ipcp = %name, flows = r.app_flows.len(), n1_above = r.n1_above.len(), "IPCP destroyed");
        let mut out = vec![format!("IPCP {name} destroyed")];
        if !r.app_flows.is_empty() {
            out.push(format!(
                "{} application flow(s) closed: ports {:?}",
                r.app_flows.len(),
                r.app_flows
            ));
        }
        for (upper, port) in &r.n1_above {
            let up = self.ipcps.get(*upper).map_or("?", |ip| ip.name.as_str());
            out.push(format!("N-1 flow {port} of {up} torn down"));
        }
        for (upper, nb) in &r.neighbors_above {
            let up = self.ipcps.get(*upper).map_or("?", |ip| ip.name.as_str());
            out.push(format!(
                "{up} forgot neighbour {nb} (reached through {name})"
            ));
        }
        if !r.n1_below.is_empty() {
            out.push(format!("its N-1 flows {:?} deallocated", r.n1_below));
        }
        if !r.names.is_empty() {
            let names: Vec<String> = r.names.iter().map(|n| n.to_string()).collect();
            out.push(format!("names withdrawn: {}", names.join(", ")));
        }
        Ok(out)
    }

    /// Starts enrolling normal IPCP `ipcp` through `neighbor` over `over`;
    /// the client is answered when it is done ([`Daemon::enroll_news`]).
    #[allow(clippy::too_many_arguments)]
    fn enroll(
        &mut self,
        conn: usize,
        id: u64,
        ipcp: &str,
        neighbor: AppName,
        over: &str,
        address: Option<u64>,
        wait: Duration,
    ) -> Result<(), CtlError> {
        let j = self.live_named(ipcp)?;
        let Some(n) = self.sys.member(j).and_then(|m| m.normal()) else {
            return Err(invalid(format!(
                "IPCP {ipcp} is a {} IPCP; only normal IPCPs enroll",
                self.kind(j)
            )));
        };
        if n.is_enrolled() {
            return Err(invalid(format!(
                "{ipcp} is a member of DIF {} already (address {}); add neighbours with `rinactl neighbor add`",
                n.config().dif,
                n.config().address
            )));
        }
        let known = self
            .sys
            .plan(j)
            .is_some_and(|p| p.neighbors.iter().any(|nb| nb.spec.name == neighbor));
        if !known {
            self.add_neighbor(ipcp, neighbor, over, address)?;
        }
        let now = self.now();
        self.enrolls.push(PendingEnroll {
            member: j,
            conn,
            id,
            since: now,
            deadline: now + wait,
            steps: Vec::new(),
        });
        Ok(())
    }

    /// News of membership from IPCP `member` for the enrollments clients
    /// wait for.
    pub(super) fn enroll_news(&mut self, member: usize, ev: &MembershipEvent) {
        let now = self.now();
        let mut done = Vec::new();
        let mut news = Vec::new();
        for (k, e) in self.enrolls.iter_mut().enumerate() {
            if e.member != member {
                continue;
            }
            let t = now.saturating_since(e.since).as_millis();
            match ev {
                MembershipEvent::EnrollStep { via, step } => {
                    e.steps.push(format!("{t} ms: {} (via {via})", step.name()))
                }
                MembershipEvent::Enrolled { via, address } => {
                    e.steps
                        .push(format!("{t} ms: enrolled via {via}, address {address}"));
                    done.push((k, Ok(*address)));
                }
                MembershipEvent::EnrollRetrying {
                    via,
                    error,
                    attempt,
                } => e.steps.push(format!(
                    "{t} ms: attempt {attempt} via {via} failed: {error}; retrying"
                )),
                MembershipEvent::EnrollFailed { via, error } => {
                    e.steps.push(format!("{t} ms: failed via {via}: {error}"));
                    done.push((k, Err(ErrorKind::Refused)));
                }
                _ => continue,
            }
            if let Some(line) = e.steps.last() {
                news.push((e.conn, e.id, line.clone()));
            }
        }
        for (conn, id, line) in news {
            if self.conns.contains_key(&conn) {
                self.send_msg(conn, &Message::Progress { id, line }, Vec::new());
            }
        }
        for (k, outcome) in done.into_iter().rev() {
            let e = self.enrolls.remove(k);
            self.answer_enroll(e, outcome);
        }
    }

    /// Answers the enrollments whose wait is over; the next deadline.
    pub(super) fn enroll_deadlines(&mut self, now: Instant) -> Option<Instant> {
        let (over, left): (Vec<_>, Vec<_>) = std::mem::take(&mut self.enrolls)
            .into_iter()
            .partition(|e| e.deadline <= now);
        self.enrolls = left;
        for e in over {
            self.answer_enroll(e, Err(ErrorKind::Timeout));
        }
        self.enrolls.iter().map(|e| e.deadline).min()
    }

    fn answer_enroll(&mut self, e: PendingEnroll, outcome: Result<u64, ErrorKind>) {
        if !self.conns.contains_key(&e.conn) {
            return;
        }
        let reply = match outcome {
            Ok(address) => Ok(Reply::Enrolled {
                address,
                steps: e.steps,
            }),
            Err(kind) => {
                let last = e.steps.last().cloned();
                let why = match (kind, last) {
                    (ErrorKind::Timeout, Some(l)) => {
                        format!("not enrolled in time; last step: {l}")
                    }
                    (ErrorKind::Timeout, None) => {
                        "not enrolled in time: no enrollment step started (is the neighbour reachable over the DIF below, and registered there?)".to_string()
                    }
                    (_, l) => format!("enrollment failed: {}", l.unwrap_or_default()),
                };
                Err(CtlError::new(
                    kind,
                    format!("{why}\nsteps:\n  {}", e.steps.join("\n  ")),
                ))
            }
        };
        self.reply(e.conn, e.id, reply, None);
    }

    /// Changes the EFCP policies of cube `cube` of normal IPCP `ipcp`.
    fn set_efcp(
        &mut self,
        ipcp: &str,
        cube: &str,
        set: serde_json::Value,
    ) -> Result<Vec<String>, CtlError> {
        let j = self.live_named(ipcp)?;
        let tuning: rina_core::efcp::EfcpTuning =
            serde_json::from_value(set).map_err(|e| invalid(format!("bad EFCP policy: {e}")))?;
        let kind = self.kind(j);
        let Some(n) = self.sys.member_mut(j).and_then(|m| m.normal_mut()) else {
            return Err(invalid(format!(
                "IPCP {ipcp} is a {kind} IPCP; only normal IPCPs have QoS cubes"
            )));
        };
        let c = n
            .set_cube_efcp(cube, &tuning)
            .map_err(|e| invalid(e.to_string()))?;
        let now = rina_core::efcp::EfcpTuning::of(&c.efcp);
        let line = format!(
            "QoS cube {} ({}) of {ipcp}: EFCP now {now} (flows allocated from now on)",
            c.name, c.id
        );
        info!(ipcp, cube = %c.name, "EFCP policies of a QoS cube changed");
        Ok(vec![line])
    }
}
