//! Addresses that never collide: detection of a shared address and
//! renumbering.
//!
//! Every member registers its management entity — its IPCP name with AE
//! [`MGMT_AE`] — in the disseminated directory, at its address. Two members
//! enrolled at the same instant by enrollers that could not know of each
//! other's choice may be given the same address; each then receives the
//! other's management entry as an entry "of its own address" it never
//! originated ([`crate::directory::Directory::take_foreign`]). The member
//! whose name is the greater (in the text form) gives its address up: it
//! picks a new one that no member it knows of holds (neighbours, flow-state
//! database, directory), starting from one hashed from its name and the
//! number of renumberings so far, takes it at once (routing, directory and
//! enrollment machines restart at the new address, neighbours learn it
//! from the next hello, which goes out at once) and reports
//! [`MembershipEvent::Renumbered`]. The other keeps its address and
//! withdraws the stale entries the loser left (as any stale own copy).
//! Renumbered members may collide again, and resolve it the same way; each
//! round keeps the least name of every group, so it ends.
//!
//! This needs the disseminated directory (a DIF without it has no
//! DIF-wide view of who holds an address). Flows of the renumbered member
//! are lost; a collision is found within the directory's flooding delay of
//! the enrollments, before applications use the new member.

use super::{MembershipEvent, NormalIpcp};
use crate::rmt::Address;
use crate::routing::LinkState;
use crate::time::Instant;
use rina_wire::AppName;
use std::collections::BTreeSet;

/// Application-entity name under which a member registers its IPCP name
/// in the directory (its management entity).
pub const MGMT_AE: &str = "Management";

/// The management entity of the IPCP named `name`.
pub fn mgmt_name(name: &AppName) -> AppName {
    AppName {
        entity_name: MGMT_AE.into(),
        entity_instance: String::new(),
        ..name.clone()
    }
}

impl NormalIpcp {
    /// Registers this member's management entity in the directory.
    pub(in crate::normal) fn register_mgmt_entity(&mut self, now: Instant) {
        let Some(name) = self.mship.as_ref().map(|m| mgmt_name(&m.cfg.name)) else {
            return;
        };
        if let Some(d) = self.dft.as_mut() {
            let _ = d.register(now, name);
        }
    }

    /// Looks for another member at this address; renumbers if this one
    /// must give way.
    pub(in crate::normal) fn check_address_conflict(&mut self, now: Instant) {
        let Some(d) = self.dft.as_mut() else {
            return;
        };
        let foreign = d.take_foreign();
        let Some(me) = self.mship.as_ref().map(|m| mgmt_name(&m.cfg.name)) else {
            return;
        };
        let mine = me.to_string();
        let twin = foreign
            .into_iter()
            .map(|(n, _)| n)
            .filter(|n| n.entity_name == MGMT_AE && n != &me)
            .find(|n| n.to_string() < mine);
        if let Some(twin) = twin {
            self.renumber(now, twin);
        }
    }

    /// Every address this IPCP knows to be held.
    fn addresses_known(&self, now: Instant) -> BTreeSet<Address> {
        let mut known: BTreeSet<Address> = self.neighbors.values().map(|n| n.0).collect();
        if let Some(r) = &self.routing {
            for f in r.fsos(now) {
                known.insert(f.origin);
                known.insert(f.neighbor);
            }
        }
        if let Some(d) = &self.dft {
            known.extend(d.entries(now).filter(|e| e.alive).map(|e| e.address));
        }
        if let Some(m) = &self.mship {
            known.extend(m.hello_from.values().map(|h| h.1));
        }
        known.insert(self.cfg.address);
        known.insert(0);
        known
    }

    /// Gives this address up to `twin`'s member and takes a free one.
    fn renumber(&mut self, now: Instant, twin: AppName) {
        let known = self.addresses_known(now);
        let Some(m) = self.mship.as_mut() else {
            return;
        };
        m.counters.renumbered += 1;
        let (first, last) = m.cfg.addresses;
        let first = first.max(1);
        let last = last.min(self.cfg.dt.addr.max_value());
        let salted: AppName = AppName {
            process_instance: format!("{}#{}", m.cfg.name.process_instance, m.counters.renumbered),
            ..m.cfg.name.clone()
        };
        let start = super::preferred_address(&salted, first, last);
        let span = last.saturating_sub(first).saturating_add(1);
        let Some(new) = (0..span)
            .map(|i| first + (start - first + i) % span)
            .find(|a| !known.contains(a))
        else {
            // No free address known: keep this one (the twin may yield).
            return;
        };
        let from = self.cfg.address;
        self.cfg.address = new;
        if let Some(rc) = self.cfg.routing.clone() {
            self.routing = LinkState::new(new, rc).ok();
            let neighbors: Vec<_> = self.neighbors.iter().map(|(p, n)| (*p, *n)).collect();
            if let Some(r) = self.routing.as_mut() {
                for (port, (addr, cost)) in neighbors {
                    let _ = r.neighbor_up(now, port, addr, cost);
                }
            }
        }
        if let Some(dc) = self.cfg.dynamic_directory.clone() {
            self.dft = crate::directory::Directory::new(new, dc).ok();
            let names: Vec<AppName> = self.names().cloned().collect();
            if let Some(d) = self.dft.as_mut() {
                for n in names {
                    let _ = d.register(now, n);
                }
                let ports: Vec<_> = self.neighbors.keys().copied().collect();
                for p in ports {
                    let _ = d.neighbor_up(now, p);
                }
            }
            self.register_mgmt_entity(now);
        }
        let members = self.new_membership();
        if let Some(m) = self.mship.as_mut() {
            m.members = Some(members);
        }
        self.routing_timeout(now);
        self.directory_timeout(now);
        let ports: Vec<_> = self.rmt.primary_ports().collect();
        for p in ports {
            self.send_hello(now, p);
        }
        self.actions
            .push_back(super::Action::Membership(MembershipEvent::Renumbered {
                from,
                to: new,
                twin,
            }));
    }
}
