//! The RIB of a normal member as the system sees it: the IPCP's own
//! objects, plus its neighbours and the state of their N-1 flows, which
//! only the system's resource allocator knows.

use super::PortId;
use super::System;
use crate::rib::{self, ObjValue, Rib};

impl System {
    /// The RIB of normal member `i` with a `Neighbor` object per
    /// configured neighbour under `/difm/enr/neighs` (address, the DIF
    /// below, and whether its N-1 flow is up, on which port and lanes,
    /// being allocated, or down); `None` if `i` is not a normal member.
    pub fn normal_rib(&self, i: usize) -> Option<Rib> {
        let n = self.member(i)?.normal()?;
        let mut r = n.rib();
        let rmt = n.rmt();
        let on = |p: PortId| match rmt.lower_cube(p) {
            Some(c) => format!("{p} (cube {})", c.name),
            None => p.to_string(),
        };
        let neighbors = self.plan(i).map_or(&[][..], |p| &p.neighbors[..]);
        for nb in neighbors {
            let state = match nb.port {
                Some(p) => {
                    let lanes: Vec<String> = rmt
                        .lanes()
                        .filter(|(_, l)| l.primary == p)
                        .map(|(l, _)| on(l))
                        .collect();
                    if lanes.is_empty() {
                        format!("up on N-1 port {}", on(p))
                    } else {
                        format!("up on N-1 port {}, lanes {}", on(p), lanes.join(", "))
                    }
                }
                None if nb.pending.is_some() => "allocating".to_string(),
                None => "down".to_string(),
            };
            let below = self.members.get(nb.lower).map_or("?", |m| m.dif.as_str());
            let address = nb
                .spec
                .address
                .map_or_else(|| "from hellos".to_string(), |a| a.to_string());
            let _ = r.create_with_parents(
                &format!("/difm/enr/neighs/pn={}", nb.spec.name),
                "Neighbor",
                ObjValue::Str(format!("address {address}, over DIF {below}, {state}")),
                rib::OwnerId::ENROLLMENT,
            );
        }
        Some(r)
    }
}
