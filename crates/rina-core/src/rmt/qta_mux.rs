//! QTA-Mux (seeds 003 and 004): a policer/shaper per QoS cube feeding a
//! cherish/urgency multiplexer.
//!
//! Per port:
//!
//! 1. Management PDUs bypass everything and are served first (bounded queue).
//! 2. A data PDU goes to the policer/shaper (P/S) of its cube, if the cube
//!    has a rate limit: a token bucket that drops ([`Excess::Drop`]) or holds
//!    ([`Excess::Delay`], bounded queue) PDUs beyond the rate.
//! 3. A PDU the P/S lets through is offered to the C/U mux, which drops it
//!    if the occupancy ([`Occupancy`]: the whole mux of the port, or the
//!    urgency queue it joins) is at or above its threshold (its cube's, else
//!    its cherish level's), and otherwise appends it to the FIFO of its
//!    urgency level.
//! 4. Service: the most urgent non-empty level, except that with probability
//!    `skip_probability` (one seeded draw, only when another level has PDUs)
//!    it is skipped for the next non-empty one, so the least urgent are not
//!    starved.
//!
//! Unlike IRATI's implementation the buffer is bounded everywhere
//! (management and shaper queues included) and the P/S queue is FIFO (the
//! 2016 IRATI code served it LIFO). QoS-ids that are not in the C/U map
//! share one cube, `qos-other`, in the map's default cell, so PDUs with
//! made-up QoS-ids cannot make the policy's state grow.

use super::config::{CuCell, CuMap, Excess, Occupancy, QtaCubeConfig, QtaMuxConfig};
use super::tally::{cell_name, urgency_name, MgmtQueue, SplitMix64, Tally};
use super::token_bucket::TokenBucket;
use super::{PortId, QosId, QueueStats, QueuedPdu, Scheduler};
use crate::ids::IdMap;
use crate::time::Instant;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

#[derive(Debug, Clone)]
struct Cube {
    /// `None` for the shared cube of QoS-ids outside the map.
    qos_id: Option<QosId>,
    cell: CuCell,
    threshold: usize,
    ps: Option<(TokenBucket, Excess)>,
    shaper: VecDeque<QueuedPdu>,
    shaper_cap: usize,
    tally: Tally,
}

impl Cube {
    fn name(&self) -> String {
        match self.qos_id {
            Some(q) => format!(
                "qos-{q} ({})",
                cell_name(self.cell.urgency, self.cell.cherish)
            ),
            None => format!(
                "qos-other ({})",
                cell_name(self.cell.urgency, self.cell.cherish)
            ),
        }
    }
}

#[derive(Debug, Clone)]
struct Port {
    mgmt: MgmtQueue,
    cubes: Vec<Cube>,
    /// One FIFO of (cube index, PDU) per urgency level.
    mux: Vec<VecDeque<(usize, QueuedPdu)>>,
    mux_tally: Vec<Tally>,
    mux_len: usize,
    /// PDUs waiting in the cubes' shapers, all cubes together (so that a
    /// port with none skips the walk over its cubes).
    shaped: usize,
}

/// The QTA-Mux scheduling policy.
#[derive(Debug)]
pub struct QtaMux {
    cfg: QtaMuxConfig,
    /// Index of each mapped QoS-id's cube; the last cube is `qos-other`.
    index: BTreeMap<QosId, usize>,
    template: Port,
    ports: IdMap<PortId, Port>,
    rng: SplitMix64,
}

impl QtaMux {
    /// The policy for cubes placed by `cu`; see
    /// [`super::SchedulerConfig::build`], which checks the parameters first
    /// (this assumes they are checked).
    pub(crate) fn new(cfg: QtaMuxConfig, cu: CuMap) -> Self {
        // Settings by QoS-id, looked up in a map: a list scanned per cube
        // made building quadratic in the cubes a file lists.
        let settings: BTreeMap<QosId, &QtaCubeConfig> =
            cfg.cubes.iter().rev().map(|c| (c.qos_id, c)).collect();
        let mut ids: Vec<QosId> = cu.iter().map(|(q, _)| q).collect();
        let mut listed: BTreeSet<QosId> = ids.iter().copied().collect();
        for c in &cfg.cubes {
            if listed.insert(c.qos_id) {
                ids.push(c.qos_id);
            }
        }
        let make = |qos_id: Option<QosId>| {
            let cell = qos_id.map_or(cu.default_cell(), |q| cu.cell(q));
            let over = qos_id.and_then(|q| settings.get(&q).copied());
            let level_th = cfg
                .cherish_thresholds
                .get(usize::from(cell.cherish))
                .or(cfg.cherish_thresholds.last())
                .copied()
                .unwrap_or(1);
            Cube {
                qos_id,
                cell,
                threshold: over.and_then(|c| c.threshold).unwrap_or(level_th),
                ps: over.and_then(|c| c.limit.map(|l| (TokenBucket::new(l), c.excess))),
                shaper: VecDeque::new(),
                shaper_cap: over.map_or(1, |c| c.shaper_queue_len),
                tally: Tally::default(),
            }
        };
        let mut cubes: Vec<Cube> = ids.iter().map(|&q| make(Some(q))).collect();
        cubes.push(make(None));
        let levels = cubes
            .iter()
            .map(|c| usize::from(c.cell.urgency) + 1)
            .max()
            .unwrap_or(1);
        let template = Port {
            mgmt: MgmtQueue::new(cfg.mgmt_queue_len),
            cubes,
            mux: vec![VecDeque::new(); levels],
            mux_tally: vec![Tally::default(); levels],
            mux_len: 0,
            shaped: 0,
        };
        QtaMux {
            rng: SplitMix64::new(cfg.seed),
            index: ids.iter().enumerate().map(|(i, &q)| (q, i)).collect(),
            cfg,
            template,
            ports: IdMap::default(),
        }
    }

    fn cube_of(&self, qos_id: QosId) -> usize {
        self.index
            .get(&qos_id)
            .copied()
            .unwrap_or(self.template.cubes.len() - 1)
    }
}

/// Offers a PDU the P/S let through to the C/U mux.
fn admit(port: &mut Port, occupancy: Occupancy, i: usize, pdu: QueuedPdu) -> Result<(), QueuedPdu> {
    let cube = &mut port.cubes[i];
    let u = usize::from(cube.cell.urgency);
    let occ = match occupancy {
        Occupancy::Port => port.mux_len,
        Occupancy::Urgency => port.mux[u].len(),
    };
    if occ >= cube.threshold {
        cube.tally.discard();
        port.mux_tally[u].refuse();
        return Err(pdu);
    }
    port.mux[u].push_back((i, pdu));
    port.mux_tally[u].push();
    port.mux_len += 1;
    Ok(())
}

/// Moves the PDUs whose tokens have come from the shapers to the mux.
fn pump(port: &mut Port, occupancy: Occupancy, now: Instant) {
    if port.shaped == 0 {
        return;
    }
    for i in 0..port.cubes.len() {
        loop {
            let cube = &mut port.cubes[i];
            let Some((bucket, Excess::Delay)) = cube.ps.as_mut() else {
                break;
            };
            let Some(head) = cube.shaper.front() else {
                break;
            };
            if !bucket.try_take(now, head.bytes.len()) {
                break;
            }
            let Some(pdu) = cube.shaper.pop_front() else {
                break;
            };
            port.shaped -= 1;
            // A drop by the mux is counted there.
            let _ = admit(port, occupancy, i, pdu);
        }
    }
}

impl Scheduler for QtaMux {
    fn name(&self) -> &'static str {
        "qta-mux"
    }

    fn create_queues(&mut self, port: PortId) {
        let t = &self.template;
        self.ports.entry(port).or_insert_with(|| t.clone());
    }

    fn destroy_queues(&mut self, port: PortId) -> usize {
        self.ports
            .remove(&port)
            .map_or(0, |p| p.mgmt.len() + p.mux_len + p.shaped)
    }

    fn enqueue(&mut self, now: Instant, port: PortId, pdu: QueuedPdu) -> Result<(), QueuedPdu> {
        let i = self.cube_of(pdu.qos_id);
        let occupancy = self.cfg.occupancy;
        let Some(p) = self.ports.get_mut(&port) else {
            return Err(pdu);
        };
        if pdu.mgmt {
            return p.mgmt.push(pdu);
        }
        let cube = &mut p.cubes[i];
        match cube.ps.as_mut() {
            None => {
                cube.tally.push();
                admit(p, occupancy, i, pdu)
            }
            Some((bucket, Excess::Drop)) => {
                if !bucket.try_take(now, pdu.bytes.len()) {
                    cube.tally.refuse();
                    return Err(pdu);
                }
                cube.tally.push();
                admit(p, occupancy, i, pdu)
            }
            Some((bucket, Excess::Delay)) => {
                if cube.shaper.len() >= cube.shaper_cap || !bucket.fits(pdu.bytes.len()) {
                    cube.tally.refuse();
                    return Err(pdu);
                }
                cube.tally.push();
                cube.shaper.push_back(pdu);
                p.shaped += 1;
                pump(p, occupancy, now);
                Ok(())
            }
        }
    }

    fn next_to_send(&mut self, now: Instant, port: PortId) -> Option<QueuedPdu> {
        let occupancy = self.cfg.occupancy;
        let p = self.ports.get_mut(&port)?;
        pump(p, occupancy, now);
        if let Some(m) = p.mgmt.pop() {
            return Some(m);
        }
        let mut non_empty = p.mux.iter().enumerate().filter(|(_, q)| !q.is_empty());
        let first = non_empty.next()?.0;
        let u = match non_empty.next() {
            Some((second, _))
                if self.cfg.skip_probability > 0.0
                    && self.rng.next_f64() < self.cfg.skip_probability =>
            {
                second
            }
            _ => first,
        };
        let (i, pdu) = p.mux[u].pop_front()?;
        p.mux_len -= 1;
        p.mux_tally[u].pop();
        p.cubes[i].tally.pop();
        Some(pdu)
    }

    fn next_wakeup(&self, port: PortId) -> Option<Instant> {
        let p = self.ports.get(&port)?;
        if p.mux_len > 0 || p.mgmt.len() > 0 || p.shaped == 0 {
            return None;
        }
        p.cubes
            .iter()
            .filter_map(|c| match (&c.ps, c.shaper.front()) {
                (Some((b, Excess::Delay)), Some(head)) => b.ready_at(head.bytes.len()),
                _ => None,
            })
            .min()
    }

    fn data_backlog(&self, port: PortId, qos_id: QosId) -> usize {
        let i = self.cube_of(qos_id);
        self.ports.get(&port).map_or(0, |p| {
            p.mux_len + p.cubes.get(i).map_or(0, |c| c.shaper.len())
        })
    }

    fn has_queued(&self, port: PortId) -> bool {
        self.ports
            .get(&port)
            .is_some_and(|p| p.mux_len > 0 || p.mgmt.len() > 0 || p.shaped > 0)
    }

    fn stats(&self, port: PortId) -> Vec<QueueStats> {
        let Some(p) = self.ports.get(&port) else {
            return Vec::new();
        };
        let mut v = vec![p.mgmt.tally.stats("mgmt")];
        v.extend(
            p.mux_tally
                .iter()
                .enumerate()
                .map(|(u, t)| t.stats(format!("urgency-{}", urgency_name(u as u8)))),
        );
        v.extend(p.cubes.iter().map(|c| c.tally.stats(c.name())));
        v
    }
}

#[cfg(test)]
mod tests {
    use super::super::config::{QtaCubeConfig, SchedulerConfig, MAX_QTA_CUBES};
    use super::*;

    /// A `qta-mux` policy lists at most [`super::super::config::MAX_QTA_CUBES`] cubes (230,000 took
    /// 36 s to check, the daemon's loop blocked meanwhile on a reload), and
    /// the settings of each are its own, the first listed for a QoS-id.
    #[test]
    fn qta_mux_cubes_are_bounded_and_each_gets_its_settings() {
        let cfg = |n: u64| {
            let mut c = QtaMuxConfig::new(vec![100]);
            c.cubes = (0..n)
                .map(|q| {
                    let mut cube = QtaCubeConfig::new(q);
                    cube.threshold = Some(q as usize + 1);
                    cube
                })
                .collect();
            c
        };
        let cu = CuMap::new();
        let e = SchedulerConfig::QtaMux(cfg(MAX_QTA_CUBES as u64 + 1))
            .build(&cu)
            .unwrap_err();
        assert!(e.to_string().contains("4097 cubes"), "{e}");
        let q = QtaMux::new(cfg(MAX_QTA_CUBES as u64), cu);
        for id in [0, 1, 2_000, MAX_QTA_CUBES as u64 - 1] {
            let c = &q.template.cubes[q.cube_of(id)];
            assert_eq!((c.qos_id, c.threshold), (Some(id), id as usize + 1));
        }
    }
}
