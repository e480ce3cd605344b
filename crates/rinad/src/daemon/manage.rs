//! Management commands that change the running system: neighbours of
//! normal IPCPs and their registrations in lower DIFs. Administrators only
//! ([`access`](super::access)); every refusal names what and why.

use super::*;

fn invalid(m: String) -> CtlError {
    CtlError::new(ErrorKind::InvalidRequest, m)
}

impl Daemon {
    /// Carries out management operation `op` for `conn`.
    pub(super) fn manage(&mut self, conn: usize, op: Op) -> Result<Reply, CtlError> {
        let what = match &op {
            Op::AddNeighbor { .. } => "adding a neighbour",
            Op::RemoveNeighbor { .. } => "removing a neighbour",
            Op::RegisterIpcp { .. } => "registering an IPCP in a lower DIF",
            _ => "unregistering an IPCP from a lower DIF",
        };
        self.require_admin(conn, what)?;
        match op {
            Op::AddNeighbor {
                ipcp,
                name,
                over,
                address,
            } => self.add_neighbor(&ipcp, name, &over, address),
            Op::RemoveNeighbor { ipcp, name } => self.remove_neighbor(&ipcp, &name),
            Op::RegisterIpcp { ipcp, dif } => {
                let (j, lower) = self.normal_and_lower(&ipcp, &dif)?;
                self.register_ipcp(j, lower)?;
                Ok(Reply::Registered { difs: vec![dif] })
            }
            Op::UnregisterIpcp { ipcp, dif } => {
                let (j, lower) = self.normal_and_lower(&ipcp, &dif)?;
                let me = self.normal_name(j);
                if self.ipcp_owned.remove(&(lower, me.clone())).is_none() {
                    return Err(invalid(format!("{ipcp} is not registered in DIF {dif}")));
                }
                self.ipcps[lower].unregister(&me);
                info!(ipcp, dif, "IPCP unregistered from a lower DIF");
                Ok(Reply::Done)
            }
            _ => Err(invalid("not a management operation".into())),
        }
    }

    /// The normal IPCP named `ipcp` and the IPCP of another DIF `dif`
    /// below it, by index.
    fn normal_and_lower(&self, ipcp: &str, dif: &str) -> Result<(usize, usize), CtlError> {
        let names: Vec<&str> = self.ipcps.iter().map(|ip| ip.name.as_str()).collect();
        let j = self
            .ipcps
            .iter()
            .position(|ip| ip.name == ipcp)
            .ok_or_else(|| {
                invalid(format!(
                    "no IPCP named {ipcp:?}; this system has {}",
                    names.join(", ")
                ))
            })?;
        if !matches!(self.ipcps[j].imp, Imp::Normal(_)) {
            let kind = self.ipcps[j].kind();
            return Err(invalid(format!(
                "IPCP {ipcp} is a {kind} IPCP; only normal IPCPs have neighbours and lower DIFs"
            )));
        }
        let own = &self.ipcps[j].dif;
        let lower = self
            .ipcps
            .iter()
            .position(|ip| ip.dif == dif && &ip.dif != own)
            .ok_or_else(|| {
                let difs: Vec<&str> = self
                    .ipcps
                    .iter()
                    .filter(|ip| &ip.dif != own)
                    .map(|ip| ip.dif.as_str())
                    .collect();
                invalid(format!(
                    "no DIF {dif:?} below {ipcp} on this system; the others are {}",
                    difs.join(", ")
                ))
            })?;
        if let Imp::Normal(l) = &self.ipcps[lower].imp {
            if l.neighbors.iter().any(|nb| nb.shim == j) {
                return Err(invalid(format!(
                    "DIF {dif} runs over {ipcp}'s own DIF: stacking it the other way too would make a loop"
                )));
            }
        }
        let frame = match &self.ipcps[j].imp {
            Imp::Normal(n) => n.machine.max_frame(),
            _ => 0,
        };
        let max = self.ipcps[lower].max_sdu();
        if frame > max {
            return Err(invalid(format!(
                "the frames of {ipcp} (up to {frame} bytes) do not fit the SDUs of DIF {dif} (at most {max})"
            )));
        }
        Ok((j, lower))
    }

    fn normal_name(&self, j: usize) -> AppName {
        match &self.ipcps[j].imp {
            Imp::Normal(n) => n.app_name.clone(),
            _ => AppName::default(),
        }
    }

    /// Registers normal IPCP `j` in IPCP `lower` (nothing if it is already).
    fn register_ipcp(&mut self, j: usize, lower: usize) -> Result<(), CtlError> {
        let me = self.normal_name(j);
        if self.ipcp_owned.contains_key(&(lower, me.clone())) {
            return Ok(());
        }
        if self.owners.contains_key(&(lower, me.clone())) {
            return Err(CtlError::new(
                ErrorKind::NameInUse,
                format!("an application holds {me} in DIF {}", self.ipcps[lower].dif),
            ));
        }
        self.ipcps[lower].register(me.clone())?;
        self.ipcp_owned.insert((lower, me.clone()), j);
        info!(ipcp = %me, dif = %self.ipcps[lower].dif, "IPCP registered in a lower DIF");
        Ok(())
    }

    fn add_neighbor(
        &mut self,
        ipcp: &str,
        name: AppName,
        over: &str,
        address: Option<u64>,
    ) -> Result<Reply, CtlError> {
        let (j, lower) = self.normal_and_lower(ipcp, over)?;
        if let Some(n) = self.normal_mut(j) {
            if n.neighbors.iter().any(|nb| nb.name == name) {
                return Err(invalid(format!(
                    "{name} is already a neighbour of {ipcp}; remove it first"
                )));
            }
        }
        self.register_ipcp(j, lower)?;
        if let Some(n) = self.normal_mut(j) {
            n.neighbors.push(normal::Neighbor {
                name: name.clone(),
                address,
                shim: lower,
                port: None,
                pending: None,
                retry_at: None,
            });
        }
        info!(ipcp, neighbor = %name, over, "neighbour added");
        Ok(Reply::Done)
    }

    fn remove_neighbor(&mut self, ipcp: &str, name: &AppName) -> Result<Reply, CtlError> {
        let j = self
            .ipcps
            .iter()
            .position(|ip| ip.name == ipcp && matches!(ip.imp, Imp::Normal(_)))
            .ok_or_else(|| invalid(format!("no normal IPCP named {ipcp:?}")))?;
        let Some(k) = self
            .normal_mut(j)
            .and_then(|n| n.neighbors.iter().position(|nb| &nb.name == name))
        else {
            return Err(invalid(format!("{name} is not a neighbour of {ipcp}")));
        };
        let now = self.now();
        let (port, pending) = match self.normal_mut(j) {
            Some(n) => (n.neighbors[k].port, n.neighbors[k].pending),
            None => (None, None),
        };
        if let Some(p) = port {
            if let Some(&(_, lower)) = self.n1_owner.get(&p) {
                self.ipcps[lower].deallocate(now, p);
            }
            self.unbind_n1(p);
        }
        // Allocations in progress for it are dropped; the indices of the
        // neighbours after it move down by one.
        let mut stale = Vec::new();
        for (&p, (jj, kk)) in self.n1_pending.iter_mut() {
            if *jj == j && *kk == k {
                stale.push(p);
            } else if *jj == j && *kk > k {
                *kk -= 1;
            }
        }
        stale.extend(pending);
        for p in stale {
            self.n1_pending.remove(&p);
            let lower = self.normal_mut(j).map(|n| n.neighbors[k].shim);
            if let Some(l) = lower {
                self.ipcps[l].deallocate(now, p);
            }
        }
        if let Some(n) = self.normal_mut(j) {
            n.neighbors.remove(k);
        }
        info!(ipcp, neighbor = %name, "neighbour removed");
        Ok(Reply::Done)
    }
}
