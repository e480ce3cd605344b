//! N-1 flows that claim a neighbour which already has a working one.
//!
//! In a DIF that authenticates its members, the N-1 flow to a neighbour is
//! bound to the peer that authenticated on it. A new flow that arrives in
//! the neighbour's name (a restarted neighbour, or someone else using its
//! name on the medium) does not replace the working one at once: it is
//! held as a *claim*, a port of the normal IPCP on which port
//! authentication runs and from which nothing else is taken. When the
//! claimant authenticates, its flow replaces the old one; if it has not
//! within [`CLAIM_TIMEOUT`], the claim is torn down and counted
//! (`n1_claims_refused`), and the working flow and its traffic never
//! noticed. In a DIF without authentication a new flow replaces the old
//! one at once, as there is nothing to wait for.

use super::member::PortId;
use super::System;
use crate::time::Instant;
use std::time::Duration;

/// How long a claimant has to authenticate.
pub const CLAIM_TIMEOUT: Duration = Duration::from_secs(10);

/// A held claim on neighbour `k` of normal member `j`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Claim {
    j: usize,
    k: usize,
    lower: usize,
    deadline: Instant,
}

impl System {
    /// Whether a new flow for neighbour `k` of `j` must wait as a claim:
    /// `j` admits ports and the neighbour's working primary `old` is
    /// admitted.
    pub(super) fn must_claim(&self, j: usize, old: PortId) -> bool {
        self.normal_of(j)
            .is_some_and(|n| n.admission_required() && n.port_admitted(old))
    }

    /// Whether lane `port` (accepted on member `lower`) comes from the peer
    /// below that `primary`'s flow goes to. A lane's frames are taken as
    /// its primary's (its admission, its keys), so in a DIF that
    /// authenticates, a lane in a working neighbour's name from anyone
    /// else is refused: no one can open one to inject frames as that
    /// neighbour, or to draw off the traffic of a cube.
    pub(super) fn lane_from_primary_peer(
        &self,
        lower: usize,
        port: PortId,
        primary: PortId,
    ) -> bool {
        let Some(&(_, plower)) = self.n1.get(&primary) else {
            return false;
        };
        let theirs = self.members[plower].flow_peer(primary);
        plower == lower && theirs.is_some() && self.members[lower].flow_peer(port) == theirs
    }

    /// Holds flow `port` (accepted on member `lower`) as a claim on
    /// neighbour `k` of `j`; an earlier claim on it is torn down.
    pub(super) fn hold_claim(
        &mut self,
        now: Instant,
        j: usize,
        k: usize,
        lower: usize,
        port: PortId,
    ) {
        let earlier: Vec<PortId> = self
            .claims
            .iter()
            .filter(|(_, c)| c.j == j && c.k == k)
            .map(|(&p, _)| p)
            .collect();
        for p in earlier {
            self.drop_claim(now, p);
        }
        self.counters.n1_claims += 1;
        self.n1_insert(port, j, lower);
        if let Some(n) = self.normal_of_mut(j) {
            n.add_port(port);
        }
        self.claims.insert(
            port,
            Claim {
                j,
                k,
                lower,
                deadline: now + CLAIM_TIMEOUT,
            },
        );
    }

    fn drop_claim(&mut self, now: Instant, port: PortId) {
        let Some(c) = self.claims.remove(&port) else {
            return;
        };
        if self.n1.contains_key(&port) {
            self.members[c.lower].deallocate(now, port);
            self.unbind_n1(now, port);
        }
    }

    /// Settles the claims: an authenticated claimant's flow replaces the
    /// old one, a late one is torn down, a gone one forgotten. True if
    /// anything changed.
    pub(super) fn settle_claims(&mut self, now: Instant) -> bool {
        if self.claims.is_empty() {
            return false;
        }
        let mut changed = false;
        let claims: Vec<(PortId, Claim)> = self.claims.iter().map(|(&p, &c)| (p, c)).collect();
        for (port, c) in claims {
            if !self.n1.contains_key(&port) {
                self.claims.remove(&port);
                changed = true;
            } else if self.normal_of(c.j).is_some_and(|n| n.port_admitted(port)) {
                self.claims.remove(&port);
                self.counters.n1_claims_admitted += 1;
                if let Some(old) = self.plans[c.j].neighbors[c.k].port {
                    if let Some(&(_, l)) = self.n1.get(&old) {
                        self.members[l].deallocate(now, old);
                    }
                    self.unbind_n1(now, old);
                }
                self.bind_n1(now, c.j, c.k, c.lower, port);
                changed = true;
            } else if now >= c.deadline {
                self.counters.n1_claims_refused += 1;
                self.drop_claim(now, port);
                changed = true;
            }
        }
        changed
    }

    /// Neighbour `k` of `j` is being removed: its claims are torn down and
    /// the claims on the neighbours after it follow their new index.
    pub(super) fn claims_neighbor_removed(&mut self, now: Instant, j: usize, k: usize) {
        let gone: Vec<PortId> = self
            .claims
            .iter()
            .filter(|(_, c)| c.j == j && c.k == k)
            .map(|(&p, _)| p)
            .collect();
        for p in gone {
            self.drop_claim(now, p);
        }
        for c in self.claims.values_mut() {
            if c.j == j && c.k > k {
                c.k -= 1;
            }
        }
    }

    /// When the next claim runs out of time.
    pub(super) fn claims_timeout(&self) -> Option<Instant> {
        self.claims.values().map(|c| c.deadline).min()
    }
}
