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

use super::{Ctx, MembershipEvent, MembershipMachine, MsOut};
use crate::rmt::Address;
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

impl MembershipMachine {
    /// Management entries of other members found at this address (the
    /// directory's foreign entries): gives the address up if one of them
    /// has the lesser name ([`MsOut::Renumber`]).
    pub(in crate::normal) fn on_foreign(
        &mut self,
        cx: &Ctx,
        now: Instant,
        foreign: impl IntoIterator<Item = AppName>,
    ) {
        let me = mgmt_name(&self.cfg.name);
        let mine = me.to_string();
        let twin = foreign
            .into_iter()
            .filter(|n| n.entity_name == MGMT_AE && n != &me)
            .find(|n| n.to_string() < mine);
        if let Some(twin) = twin {
            self.renumber(cx, now, twin);
        }
    }

    /// Every address this IPCP knows to be held.
    fn addresses_known(&self, cx: &Ctx, now: Instant) -> BTreeSet<Address> {
        let mut known: BTreeSet<Address> = cx.neighbors.values().map(|n| n.0).collect();
        if let Some(r) = cx.routing {
            for f in r.fsos(now) {
                known.insert(f.origin);
                known.insert(f.neighbor);
            }
        }
        if let Some(d) = cx.dft {
            known.extend(d.entries(now).filter(|e| e.alive).map(|e| e.address));
        }
        known.extend(self.hello_from.values().map(|h| h.1));
        known.insert(cx.address());
        known.insert(0);
        known
    }

    /// Picks a free address to take instead of this one, which `twin`'s
    /// member keeps.
    fn renumber(&mut self, cx: &Ctx, now: Instant, twin: AppName) {
        let known = self.addresses_known(cx, now);
        self.counters.renumbered += 1;
        let (first, last) = self.cfg.addresses;
        let first = first.max(1);
        let last = last.min(cx.cfg.dt.addr.max_value());
        let salted: AppName = AppName {
            process_instance: format!(
                "{}#{}",
                self.cfg.name.process_instance, self.counters.renumbered
            ),
            ..self.cfg.name.clone()
        };
        let start = super::preferred_address(&salted, first, last);
        let span = last.saturating_sub(first).saturating_add(1);
        let Some(to) = (0..span)
            .map(|i| first + (start - first + i) % span)
            .find(|a| !known.contains(a))
        else {
            // No free address known: keep this one (the twin may yield).
            return;
        };
        self.out.push_back(MsOut::Renumber { to, twin });
    }

    /// The IPCP took address `cx.address()` instead of `from`
    /// ([`MsOut::Renumber`]): enrollers hand out addresses around the new
    /// one, neighbours learn it from a hello at once.
    pub(in crate::normal) fn renumbered(
        &mut self,
        cx: &Ctx,
        now: Instant,
        from: Address,
        twin: AppName,
    ) {
        self.members = Some(self.new_membership(cx));
        self.hello_all(cx, now);
        self.report_event(MembershipEvent::Renumbered {
            from,
            to: cx.address(),
            twin,
        });
    }
}
