//! Management commands that change the running system: neighbours of
//! normal IPCPs and their registrations in lower DIFs. Administrators only
//! ([`access`](super::access)); every refusal names what and why.

use super::*;
use rina_core::system::{NeighborSpec, SystemError};

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
                if !self.sys.unregister_ipcp(j, lower) {
                    return Err(invalid(format!("{ipcp} is not registered in DIF {dif}")));
                }
                info!(ipcp, dif, "IPCP unregistered from a lower DIF");
                Ok(Reply::Done)
            }
            _ => Err(invalid("not a management operation".into())),
        }
    }

    /// The normal IPCP named `ipcp`, by index.
    fn normal_named(&self, ipcp: &str) -> Result<usize, CtlError> {
        let j = self.live_named(ipcp)?;
        if !matches!(self.ipcps[j].io, Io::Normal(_)) {
            let kind = self.kind(j);
            return Err(invalid(format!(
                "IPCP {ipcp} is a {kind} IPCP; only normal IPCPs have neighbours and lower DIFs"
            )));
        }
        Ok(j)
    }

    /// The normal IPCP named `ipcp` and the IPCP of another DIF `dif`
    /// below it, by index.
    pub(super) fn normal_and_lower(
        &self,
        ipcp: &str,
        dif: &str,
    ) -> Result<(usize, usize), CtlError> {
        let j = self.normal_named(ipcp)?;
        let lower = self.sys.lower_for(j, dif).map_err(|e| match e {
            SystemError::NoLowerIpcp { .. } => {
                let own = &self.ipcps[j].dif;
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
            }
            SystemError::FrameTooLarge { frame, max, .. } => invalid(format!(
                "the frames of {ipcp} (up to {frame} bytes) do not fit the SDUs of DIF {dif} (at most {max})"
            )),
            e => invalid(e.to_string()),
        })?;
        Ok((j, lower))
    }

    /// Registers normal IPCP `j` in IPCP `lower` (nothing if it is already).
    fn register_ipcp(&mut self, j: usize, lower: usize) -> Result<(), CtlError> {
        self.sys.register_ipcp(j, lower).map_err(ipcp::flow_error)?;
        info!(ipcp = %self.ipcps[j].name, dif = %self.ipcps[lower].dif, "IPCP registered in a lower DIF");
        Ok(())
    }

    pub(super) fn add_neighbor(
        &mut self,
        ipcp: &str,
        name: AppName,
        over: &str,
        address: Option<u64>,
    ) -> Result<Reply, CtlError> {
        let (j, lower) = self.normal_and_lower(ipcp, over)?;
        if let Some(a) = address {
            self.ipcps[j]
                .cfg
                .check_address(a)
                .map_err(|m| invalid(format!("neighbour {name} of {ipcp}: --address: {m}")))?;
        }
        if self
            .sys
            .plan(j)
            .is_some_and(|p| p.neighbors.iter().any(|nb| nb.spec.name == name))
        {
            return Err(invalid(format!(
                "{name} is already a neighbour of {ipcp}; remove it first"
            )));
        }
        self.register_ipcp(j, lower)?;
        let now = self.now();
        let spec = NeighborSpec {
            name: name.clone(),
            over: over.to_string(),
            address,
        };
        self.sys
            .add_neighbor(now, j, spec)
            .map_err(|e| invalid(e.to_string()))?;
        info!(ipcp, neighbor = %name, over, "neighbour added");
        Ok(Reply::Done)
    }

    fn remove_neighbor(&mut self, ipcp: &str, name: &AppName) -> Result<Reply, CtlError> {
        let j = self
            .ipcps
            .iter()
            .position(|ip| ip.name == ipcp && matches!(ip.io, Io::Normal(_)))
            .ok_or_else(|| invalid(format!("no normal IPCP named {ipcp:?}")))?;
        let now = self.now();
        if !self.sys.remove_neighbor(now, j, name) {
            return Err(invalid(format!("{name} is not a neighbour of {ipcp}")));
        }
        info!(ipcp, neighbor = %name, "neighbour removed");
        Ok(Reply::Done)
    }
}
