//! Removing an IPC process from a running system, with everything that
//! rests on it: the applications' flows it carries, the N-1 flows of the
//! normal IPCPs above it (and their neighbours reached through it), its
//! own N-1 flows below and its registrations there.

use super::member::PortId;
use super::{AppEvent, FlowError, Output, Plan, System, SystemError};
use crate::time::Instant;
use rina_wire::AppName;

/// What [`System::remove_ipcp`] tore down.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Removal {
    /// Application flows it carried (allocated or being allocated); their
    /// applications were told ([`AppEvent::Deallocated`] or
    /// [`AppEvent::AllocateFailed`]).
    pub app_flows: Vec<PortId>,
    /// N-1 flows of the normal IPCPs above it: (upper member, port).
    pub n1_above: Vec<(usize, PortId)>,
    /// Neighbours of upper IPCPs that were reached through it: (upper
    /// member, neighbour). They are forgotten.
    pub neighbors_above: Vec<(usize, AppName)>,
    /// Its own N-1 flows in the DIFs below.
    pub n1_below: Vec<PortId>,
    /// Application names registered in it.
    pub names: Vec<AppName>,
}

impl System {
    /// Removes member `i` at time `now`. First its application flows are
    /// deallocated (the peers are told while the N-1 flows below still
    /// carry the news), then the N-1 flows of the IPCPs above it and their
    /// neighbours over its DIF, then its own neighbours and N-1 flows, its
    /// registrations in the DIFs below and the names registered in it. Its
    /// index stays taken ([`System::is_removed`]); its name and DIF may be
    /// used again by a new member.
    pub fn remove_ipcp(&mut self, now: Instant, i: usize) -> Result<Removal, SystemError> {
        self.tick(now);
        if i >= self.members.len() || self.removed.contains(&i) {
            return Err(SystemError::NoMember(i));
        }
        let mut r = Removal::default();
        self.remove_app_flows(now, i, &mut r);
        self.pump(now);
        self.remove_above(now, i, &mut r);
        self.remove_below(now, i, &mut r);
        r.names = self
            .app_names
            .iter()
            .filter(|(m, _)| *m == i)
            .map(|(_, n)| n.clone())
            .collect();
        self.app_names.retain(|(m, _)| *m != i);
        self.ipcp_names.retain(|(m, _), _| *m != i);
        self.blocked_media.remove(&i);
        self.down_media.remove(&i);
        self.pump(now);
        self.removed.insert(i);
        self.plans[i] = Plan::default();
        Ok(r)
    }

    /// Closes the application flows of member `i` and withdraws the
    /// requests waiting for its applications.
    fn remove_app_flows(&mut self, now: Instant, i: usize, r: &mut Removal) {
        let why = format!("IPCP {} was destroyed", self.members[i].name);
        let flows: Vec<PortId> = self
            .app_flows
            .iter()
            .filter(|(_, &m)| m == i)
            .map(|(&p, _)| p)
            .collect();
        for port in flows {
            self.app_flows.remove(&port);
            self.want_writable.remove(&port);
            self.app_closing.remove(&port);
            self.members[i].deallocate(now, port);
            self.out
                .push_back(Output::App(AppEvent::Deallocated { port }));
            r.app_flows.push(port);
        }
        let pending: Vec<PortId> = self
            .app_pending
            .iter()
            .filter(|(_, &m)| m == i)
            .map(|(&p, _)| p)
            .collect();
        for port in pending {
            self.app_pending.remove(&port);
            self.members[i].deallocate(now, port);
            self.out.push_back(Output::App(AppEvent::AllocateFailed {
                port,
                error: FlowError::NoIpcp(why.clone()),
            }));
            r.app_flows.push(port);
        }
        let requests: Vec<u64> = self
            .incoming
            .iter()
            .filter(|(_, &(m, _))| m == i)
            .map(|(&h, _)| h)
            .collect();
        for handle in requests {
            if let Some((_, h)) = self.incoming.remove(&handle) {
                let _ = self.members[i].refuse(h, &why);
            }
            self.out
                .push_back(Output::App(AppEvent::RequestWithdrawn { handle }));
        }
    }

    /// Tears down the N-1 flows of the IPCPs above member `i` and forgets
    /// their neighbours reached through it.
    fn remove_above(&mut self, now: Instant, i: usize, r: &mut Removal) {
        let over: Vec<(PortId, usize)> = self
            .n1
            .iter()
            .filter(|(_, &(_, l))| l == i)
            .map(|(&p, &(u, _))| (p, u))
            .collect();
        for (port, upper) in over {
            if self.n1.contains_key(&port) {
                self.members[i].deallocate(now, port);
                self.unbind_n1(now, port);
                r.n1_above.push((upper, port));
            }
        }
        for j in 0..self.plans.len() {
            let names: Vec<AppName> = self.plans[j]
                .neighbors
                .iter()
                .filter(|nb| nb.lower == i)
                .map(|nb| nb.spec.name.clone())
                .collect();
            for name in names {
                self.remove_neighbor(now, j, &name);
                r.neighbors_above.push((j, name));
            }
        }
    }

    /// Tears down member `i`'s own N-1 flows and registrations below it.
    fn remove_below(&mut self, now: Instant, i: usize, r: &mut Removal) {
        r.n1_below = self
            .n1
            .iter()
            .filter(|(_, &(u, _))| u == i)
            .map(|(&p, _)| p)
            .collect();
        let own: Vec<AppName> = self.plans[i]
            .neighbors
            .iter()
            .map(|nb| nb.spec.name.clone())
            .collect();
        for name in own {
            self.remove_neighbor(now, i, &name);
        }
        let under: Vec<(PortId, usize)> = self
            .n1
            .iter()
            .filter(|(_, &(u, _))| u == i)
            .map(|(&p, &(_, l))| (p, l))
            .collect();
        for (port, lower) in under {
            self.n1_remove(port);
            self.gated.remove(&port);
            self.members[lower].deallocate(now, port);
        }
        let pending: Vec<PortId> = self
            .n1_pending
            .iter()
            .filter(|(_, &(j, _))| j == i)
            .map(|(&p, _)| p)
            .collect();
        for port in pending {
            self.n1_pending.remove(&port);
            if let Some(lower) = self.members.iter().position(|m| m.has_flow(port)) {
                self.members[lower].deallocate(now, port);
            }
        }
        let regs: Vec<(usize, AppName)> = self
            .ipcp_names
            .iter()
            .filter(|(_, &j)| j == i)
            .map(|(k, _)| k.clone())
            .collect();
        for (lower, name) in regs {
            self.ipcp_names.remove(&(lower, name.clone()));
            self.members[lower].unregister(&name);
        }
    }
}
