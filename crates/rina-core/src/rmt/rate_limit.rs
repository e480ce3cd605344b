//! The 2-D urgency/cherish rate limiter of seed 004 §4 ("R-lim").
//!
//! One FIFO per cell of the C/U matrix, and two independent credit
//! counters ([`Credits`]): one per urgency level and one per cherish level.
//! At each call the counters gain credit in proportion to the time elapsed
//! and each level's rate; a PDU may be served when both its urgency and its
//! cherish dimension allow it, and its size is then consumed in both.
//! Within the servable cells the oldest PDU of the most urgent non-empty
//! level is served. The policy is not work-conserving: with PDUs queued and
//! no credit, it declines and [`Scheduler::next_wakeup`] says when credit
//! will allow the next PDU.
//!
//! # Where this follows the prose rather than the pseudo-code
//!
//! The prose of seed 004 and its Consume/Gain pseudo-code disagree; the
//! prose is followed and the differences are:
//!
//! 1. **Consume** takes credit from levels `level, level−1, …, 0` but only
//!    from levels that *have* credit. The pseudo-code also "takes" from a
//!    level with negative credit (`credit -= Credits[i]; Credits[i] = 0`),
//!    which would wipe that level's debt and charge it to the PDU; the prose
//!    says credits are taken from upper levels and the own level is left
//!    negative only if they do not have enough.
//! 2. **Gain**, repayment: the pseudo-code walks the debtor index with
//!    `j++` from `N−1` (off the end) and tests `t >= Credits[j]` against a
//!    negative number (always true). Here level `i`'s gain repays the debts
//!    of the levels allowed to borrow from it (`j > i`), walking `j` from
//!    `N−1` down to `i+1` and keeping its position between levels as the
//!    pseudo-code does, and only what is left goes to level `i` itself
//!    (which repays its own debt first by plain addition).
//! 3. **Gain**, backlog cap: the pseudo-code's second loop re-adds the last
//!    leftover `t` of the first loop to level 0 and never resets `t`. Here
//!    the surplus of each level above its maximum backlog goes to the next
//!    level only, from the most to the least urgent; the surplus of the last
//!    level is lost.
//!
//! Where the text is silent: credits start at zero; management PDUs are
//! served first and cost no credit; each cell's queue is bounded on its own
//! (`queue_len`, lowered per cherish level by `cherish_thresholds`) rather
//! than by thresholds on one shared buffer as in `rmt-rlim.c`: with a shared
//! buffer, the backlog of a cell held back by its limit fills the buffer and
//! shuts every less cherished cell out, so the lower levels could not use
//! what the higher ones leave; elapsed time is capped at one hour per call
//! (no credit is lost by it unless a debt is larger than an hour of gains).

use super::config::{CuMap, LevelLimit, RateLimitConfig};
use super::tally::{cell_name, MgmtQueue, Tally};
use super::{PortId, QueueStats, QueuedPdu, Scheduler};
use crate::ids::IdMap;
use crate::time::Instant;
use std::collections::VecDeque;
use std::time::Duration;

/// Credit units per bit: credit is counted in nano-bits, so a level of
/// rate `r` bit/s gains exactly `r` units per nanosecond.
pub const UNITS_PER_BIT: i128 = 1_000_000_000;

const MAX_ELAPSED_NS: u64 = 3_600_000_000_000;

/// The credit counters of one dimension (urgency or cherish): one per
/// level, index 0 the most urgent / most cherished. Amounts are in
/// [`UNITS_PER_BIT`] units; the `*_bits` methods work in whole bits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credits {
    credit: Vec<i128>,
    max: Vec<i128>,
    rate: Vec<u64>,
}

impl Credits {
    /// Counters at zero for `levels`.
    pub fn new(levels: &[LevelLimit]) -> Self {
        Credits {
            credit: vec![0; levels.len()],
            max: levels
                .iter()
                .map(|l| i128::from(l.max_backlog_bytes) * 8 * UNITS_PER_BIT)
                .collect(),
            rate: levels.iter().map(|l| l.rate_bps).collect(),
        }
    }

    /// Number of levels.
    pub fn levels(&self) -> usize {
        self.credit.len()
    }

    /// Credit of every level, in whole bits (rounded toward zero).
    pub fn bits(&self) -> Vec<i64> {
        self.credit
            .iter()
            .map(|&c| (c / UNITS_PER_BIT) as i64)
            .collect()
    }

    /// Sets the credit of every level, in bits (for tests and inspection).
    pub fn set_bits(&mut self, bits: &[i64]) {
        for (c, &b) in self.credit.iter_mut().zip(bits) {
            *c = i128::from(b) * UNITS_PER_BIT;
        }
    }

    /// The most urgent (lowest) level with positive credit: PDUs of this
    /// level and of every less urgent one may be served (seed 004: with
    /// credits `[0, −5, 20, 50]` only levels 2 and 3 may be).
    pub fn first_positive(&self) -> Option<usize> {
        self.credit.iter().position(|&c| c > 0)
    }

    /// Whether a PDU of `level` may be served.
    pub fn allows(&self, level: usize) -> bool {
        self.first_positive().is_some_and(|f| f <= level)
    }

    /// Gains for `elapsed` at each level's rate.
    pub fn gain_for(&mut self, elapsed: Duration) {
        let ns = i128::from(
            u64::try_from(elapsed.as_nanos())
                .unwrap_or(u64::MAX)
                .min(MAX_ELAPSED_NS),
        );
        let added: Vec<i128> = self.rate.iter().map(|&r| ns * i128::from(r)).collect();
        self.gain(&added);
    }

    /// [`Credits::gain`] with amounts in bits.
    pub fn gain_bits(&mut self, added: &[i64]) {
        let a: Vec<i128> = added
            .iter()
            .map(|&b| i128::from(b) * UNITS_PER_BIT)
            .collect();
        self.gain(&a);
    }

    /// Adds `added[i]` to level `i`: from the least to the most urgent
    /// level, each level's gain first repays the debts of the levels below
    /// it (those that may borrow from it), then goes to the level; then,
    /// from the most to the least urgent, a level above its maximum backlog
    /// passes the surplus to the next one.
    pub fn gain(&mut self, added: &[i128]) {
        let n = self.credit.len();
        if n == 0 {
            return;
        }
        let c = &mut self.credit;
        let mut j = n - 1;
        for i in (0..n).rev() {
            let mut t = added.get(i).copied().unwrap_or(0).max(0);
            while j > i && t > 0 {
                if c[j] < 0 {
                    if t >= -c[j] {
                        t += c[j];
                        c[j] = 0;
                    } else {
                        c[j] += t;
                        t = 0;
                        break;
                    }
                }
                j -= 1;
            }
            c[i] += t;
        }
        let mut surplus = 0;
        for (ci, &max) in c.iter_mut().zip(&self.max) {
            *ci += surplus;
            surplus = 0;
            if *ci > max {
                surplus = *ci - max;
                *ci = max;
            }
        }
    }

    /// [`Credits::consume`] with an amount in bits.
    pub fn consume_bits(&mut self, level: usize, bits: i64) {
        self.consume(level, i128::from(bits) * UNITS_PER_BIT);
    }

    /// Spends `amount` for a PDU of `level`: from the level itself, then
    /// from the levels above it (more urgent / cherished) that have credit,
    /// nearest first; what they cannot pay leaves `level` negative.
    pub fn consume(&mut self, level: usize, mut amount: i128) {
        if level >= self.credit.len() {
            return;
        }
        for i in (0..=level).rev() {
            let have = self.credit[i];
            if have <= 0 {
                continue;
            }
            if amount <= have {
                self.credit[i] -= amount;
                return;
            }
            amount -= have;
            self.credit[i] = 0;
        }
        self.credit[level] -= amount;
    }
}

#[derive(Debug, Clone)]
struct Port {
    mgmt: MgmtQueue,
    /// FIFO of (arrival number, PDU) per cell, index `u * C + c`.
    cells: Vec<VecDeque<(u64, QueuedPdu)>>,
    tally: Vec<Tally>,
    total: usize,
    seq: u64,
    urgency: Credits,
    cherish: Credits,
    last: Option<Instant>,
}

impl Port {
    fn advance(&mut self, now: Instant) {
        match self.last {
            Some(l) if now > l => {
                self.urgency.gain_for(now - l);
                self.cherish.gain_for(now - l);
                self.last = Some(now);
            }
            Some(_) => {}
            None => self.last = Some(now),
        }
    }
}

/// The 2-D urgency/cherish rate limiter.
#[derive(Debug)]
pub struct RateLimit2d {
    cfg: RateLimitConfig,
    cu: CuMap,
    template: Port,
    ports: IdMap<PortId, Port>,
}

impl RateLimit2d {
    /// The policy for cubes placed by `cu`; see
    /// [`super::SchedulerConfig::build`], which checks the parameters first
    /// (this assumes they are checked).
    pub(crate) fn new(cfg: RateLimitConfig, cu: CuMap) -> Self {
        let cells = cfg.urgency.len() * cfg.cherish.len();
        let template = Port {
            mgmt: MgmtQueue::new(cfg.mgmt_queue_len),
            cells: vec![VecDeque::new(); cells],
            tally: vec![Tally::default(); cells],
            total: 0,
            seq: 0,
            urgency: Credits::new(&cfg.urgency),
            cherish: Credits::new(&cfg.cherish),
            last: None,
        };
        RateLimit2d {
            cfg,
            cu,
            template,
            ports: IdMap::default(),
        }
    }

    /// The credit counters of `port`: (urgency, cherish).
    pub fn credits(&self, port: PortId) -> Option<(&Credits, &Credits)> {
        self.ports.get(&port).map(|p| (&p.urgency, &p.cherish))
    }

    /// The credit counters of `port`, to inspect or preset them.
    pub fn credits_mut(&mut self, port: PortId) -> Option<(&mut Credits, &mut Credits)> {
        self.ports
            .get_mut(&port)
            .map(|p| (&mut p.urgency, &mut p.cherish))
    }

    fn nc(&self) -> usize {
        self.cfg.cherish.len()
    }

    /// The cell to serve with the credits `u`, `c`: the oldest head among
    /// the servable cells of the most urgent level that has one.
    fn pick(&self, p: &Port, u: &Credits, c: &Credits) -> Option<usize> {
        let (fu, fc) = (u.first_positive()?, c.first_positive()?);
        let nc = self.nc();
        for ul in fu..self.cfg.urgency.len() {
            let best = (fc..nc)
                .map(|cl| ul * nc + cl)
                .filter_map(|i| p.cells[i].front().map(|(s, _)| (*s, i)))
                .min();
            if let Some((_, i)) = best {
                return Some(i);
            }
        }
        None
    }
}

impl Scheduler for RateLimit2d {
    fn name(&self) -> &'static str {
        "rate-limit-2d"
    }

    fn create_queues(&mut self, port: PortId) {
        let t = &self.template;
        self.ports.entry(port).or_insert_with(|| t.clone());
    }

    fn destroy_queues(&mut self, port: PortId) -> usize {
        self.ports
            .remove(&port)
            .map_or(0, |p| p.total + p.mgmt.len())
    }

    fn enqueue(&mut self, now: Instant, port: PortId, pdu: QueuedPdu) -> Result<(), QueuedPdu> {
        let cell = self.cu.cell(pdu.qos_id);
        let nc = self.nc();
        let (u, c) = (
            usize::from(cell.urgency).min(self.cfg.urgency.len() - 1),
            usize::from(cell.cherish).min(nc - 1),
        );
        let th = self
            .cfg
            .cherish_thresholds
            .get(c)
            .copied()
            .unwrap_or(self.cfg.queue_len)
            .min(self.cfg.queue_len);
        let Some(p) = self.ports.get_mut(&port) else {
            return Err(pdu);
        };
        p.advance(now);
        if pdu.mgmt {
            return p.mgmt.push(pdu);
        }
        let i = u * nc + c;
        if p.cells[i].len() >= th {
            p.tally[i].refuse();
            return Err(pdu);
        }
        p.seq += 1;
        p.cells[i].push_back((p.seq, pdu));
        p.tally[i].push();
        p.total += 1;
        Ok(())
    }

    fn next_to_send(&mut self, now: Instant, port: PortId) -> Option<QueuedPdu> {
        let nc = self.nc();
        let p = self.ports.get_mut(&port)?;
        p.advance(now);
        if let Some(m) = p.mgmt.pop() {
            return Some(m);
        }
        let p = self.ports.get(&port)?;
        let i = self.pick(p, &p.urgency, &p.cherish)?;
        let p = self.ports.get_mut(&port)?;
        let (_, pdu) = p.cells[i].pop_front()?;
        let cost = (pdu.bytes.len() as i128) * 8 * UNITS_PER_BIT;
        p.urgency.consume(i / nc, cost);
        p.cherish.consume(i % nc, cost);
        p.tally[i].pop();
        p.total -= 1;
        Some(pdu)
    }

    fn next_wakeup(&self, port: PortId) -> Option<Instant> {
        let p = self.ports.get(&port)?;
        if p.total == 0 || p.mgmt.len() > 0 {
            return None;
        }
        let last = p.last?;
        let servable = |ns: u64| {
            let (mut u, mut c) = (p.urgency.clone(), p.cherish.clone());
            u.gain_for(Duration::from_nanos(ns));
            c.gain_for(Duration::from_nanos(ns));
            self.pick(p, &u, &c).is_some()
        };
        if servable(0) {
            return Some(last);
        }
        // Credit only grows with time, so bisect for the first instant at
        // which some queued PDU becomes servable.
        let (mut lo, mut hi) = (0u64, 1_000u64);
        while !servable(hi) {
            if hi >= MAX_ELAPSED_NS {
                return Some(last + Duration::from_nanos(MAX_ELAPSED_NS));
            }
            lo = hi;
            hi = hi.saturating_mul(4).min(MAX_ELAPSED_NS);
        }
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if servable(mid) {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        Some(last + Duration::from_nanos(hi))
    }

    fn data_backlog(&self, port: PortId, _qos_id: super::QosId) -> usize {
        self.ports.get(&port).map_or(0, |p| p.total)
    }

    fn has_queued(&self, port: PortId) -> bool {
        self.ports
            .get(&port)
            .is_some_and(|p| p.total > 0 || p.mgmt.len() > 0)
    }

    fn stats(&self, port: PortId) -> Vec<QueueStats> {
        let Some(p) = self.ports.get(&port) else {
            return Vec::new();
        };
        let nc = self.nc();
        let mut v = vec![p.mgmt.tally.stats("mgmt")];
        v.extend(
            p.tally
                .iter()
                .enumerate()
                .map(|(i, t)| t.stats(cell_name((i / nc) as u8, (i % nc) as u8))),
        );
        v
    }
}
