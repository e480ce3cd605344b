//! DTP, receiving side: sequencing, duplicate detection, the bounded
//! reordering queue, the max-SDU-gap rule, data runs and receiver inactivity.
//!
//! The reordering queue is a ring indexed by `seq - lwe - 1`: slot 0 is the
//! next expected PDU (always empty while anything is queued), so inserting,
//! finding a duplicate and advancing the LWE are O(1), and a `VecDeque` that
//! keeps its capacity means no allocation on the per-PDU path.

use super::config::EfcpConfig;
use super::{Delivery, Stats};
use crate::buf::PduBuf;
use crate::time::Instant;
use std::collections::VecDeque;
use std::time::Duration;

/// One sequence number after the LWE.
#[derive(Debug)]
enum Slot {
    /// Not received (yet).
    Empty,
    /// Received out of order, waiting for in-order delivery.
    Held { payload: PduBuf, at: Instant },
    /// Received and already delivered (out-of-order delivery): kept only to
    /// detect duplicates and to advance the LWE.
    Seen { at: Instant },
}

impl Slot {
    fn arrived(&self) -> Option<Instant> {
        match self {
            Slot::Empty => None,
            Slot::Held { at, .. } | Slot::Seen { at } => Some(*at),
        }
    }
}

/// What became of a data PDU, for the ack policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RxOutcome {
    /// It was the next expected PDU and nothing was queued behind it.
    InOrder,
    /// It was the next expected PDU and filled a hole.
    FilledHole,
    /// It arrived after a hole and was queued (or delivered, if out-of-order
    /// delivery is allowed).
    OutOfOrder,
    /// Already received (or already given up).
    Duplicate,
    /// Dropped: too far ahead for the reordering queue.
    DroppedQueue,
    /// Dropped: no data run and no DRF (with retransmission), and no room
    /// to hold it until the run starts.
    DroppedNoRun,
    /// Held: no data run yet (its DRF PDU was lost); delivered once the
    /// retransmitted DRF PDU starts the run.
    HeldNoRun,
    /// Dropped: beyond anything the sender may have sent (forged, or
    /// replayed from another connection).
    OutOfWindow,
}

/// The receiving half of an EFCP connection.
#[derive(Debug)]
pub(super) struct Receiver {
    in_order: bool,
    max_gap: Option<u64>,
    rtx: bool,
    max_reorder: usize,
    a_timer: Duration,
    inactivity: Duration,
    track_consumption: bool,
    /// The LWE: every seq up to it was received or given up. `None` while
    /// no data run is live.
    lwe: Option<u64>,
    ring: VecDeque<Slot>,
    /// Non-empty slots in the ring.
    above: usize,
    /// `Held` slots in the ring.
    ring_held: usize,
    /// Highest seq known to have been sent (from data and rendezvous).
    edge: u64,
    /// When `edge` was last raised.
    edge_at: Instant,
    /// Seqs given up right before LWE+1, in a hole not yet closed.
    open_gap: u64,
    ready: VecDeque<Delivery>,
    unconsumed: usize,
    hole_deadline: Option<Instant>,
    last_rx: Instant,
    /// PDUs that arrived before their run's DRF PDU (retransmitting flows
    /// only), at most `max_reorder` of them.
    prerun: std::collections::BTreeMap<u64, PduBuf>,
    /// The highest LWE any ended run reached: sequence numbers never
    /// restart within a connection, so nothing at or below it is new, with
    /// or without a live run. `None` while the peer's first sequence number
    /// is unknown (and no run has ended).
    floor: Option<u64>,
    /// When a data PDU was last taken (neither duplicate nor out of
    /// window): an unreliable flow resynchronises after 2Δ without one.
    last_accept: Instant,
}

impl Receiver {
    pub(super) fn new(cfg: &EfcpConfig, now: Instant) -> Self {
        Receiver {
            in_order: cfg.in_order,
            max_gap: cfg.max_sdu_gap,
            rtx: cfg.rtx().is_some(),
            max_reorder: cfg.max_reorder,
            a_timer: cfg.a_timer,
            inactivity: cfg.delta_t().saturating_mul(2),
            track_consumption: cfg.window().is_some(),
            lwe: None,
            ring: VecDeque::new(),
            above: 0,
            ring_held: 0,
            edge: 0,
            edge_at: now,
            open_gap: 0,
            ready: VecDeque::new(),
            unconsumed: 0,
            hole_deadline: None,
            last_rx: now,
            prerun: std::collections::BTreeMap::new(),
            floor: None,
            last_accept: now,
        }
    }

    /// Declares that the peer's first sequence number is `first` (so
    /// nothing below it is ever new, and the window rules apply from the
    /// first PDU).
    pub(super) fn expect_first(&mut self, first: u64) {
        self.floor = Some(first.saturating_sub(1));
    }

    /// The highest sequence number known not to be new: the LWE of the live
    /// run, else the floor left by the runs before it.
    pub(super) fn base(&self) -> Option<u64> {
        self.lwe.or(self.floor)
    }

    /// Whether an out-of-window PDU may resynchronise the receiver: only
    /// on a flow without retransmission or window (whose sender is bound by
    /// nothing the receiver knows), after 2Δ with no PDU taken.
    fn may_resync(&self, now: Instant) -> bool {
        !self.rtx && !self.track_consumption && now >= self.last_accept + self.inactivity
    }

    /// The highest sequence number known to have been sent.
    pub(super) fn edge(&self) -> u64 {
        self.edge
    }

    /// The LWE, while a data run is live.
    pub(super) fn lwe(&self) -> Option<u64> {
        self.lwe
    }

    /// PDUs occupying the receiver buffer: queued out of order, ready for
    /// delivery, and delivered but not consumed.
    pub(super) fn buffered(&self) -> usize {
        self.ring_held + self.ready.len() + self.unconsumed
    }

    /// The RWE to grant with a buffer of `buffer` PDUs, while a run is live.
    ///
    /// Every seq in `(lwe, rwe]` not yet received needs at most one buffer
    /// slot, so `rwe = lwe + buffer - buffered + received_above_lwe` keeps
    /// the buffer from overflowing. With retransmission it is also never
    /// beyond what the reordering queue takes (`max_reorder + 1` past the
    /// LWE): a PDU further ahead would be dropped, so a window wider than
    /// the queue would make one loss cost every PDU sent beyond it too, and
    /// recovery would crawl at one PDU per round trip. It never decreases:
    /// taking a PDU into the buffer either fills a counted slot or moves
    /// the LWE by one, and the queue's edge moves with the LWE.
    pub(super) fn rwe(&self, buffer: usize) -> Option<u64> {
        self.lwe.map(|l| {
            let room = l
                .saturating_add(buffer as u64)
                .saturating_add(self.above as u64)
                .saturating_sub(self.buffered() as u64);
            if self.rtx {
                room.min(l.saturating_add(self.max_reorder as u64 + 1))
            } else {
                room
            }
        })
    }

    pub(super) fn hole_deadline(&self) -> Option<Instant> {
        self.hole_deadline
    }

    pub(super) fn inactivity_deadline(&self) -> Option<Instant> {
        self.lwe.map(|_| self.last_rx + self.inactivity)
    }

    pub(super) fn poll_deliver(&mut self, stats: &mut Stats) -> Option<Delivery> {
        let d = self.ready.pop_front()?;
        stats.delivered += 1;
        if self.track_consumption {
            self.unconsumed += 1;
        }
        Some(d)
    }

    /// The application consumed `n` delivered SDUs.
    pub(super) fn consumed(&mut self, n: usize) {
        self.unconsumed = self.unconsumed.saturating_sub(n);
    }

    pub(super) fn unconsumed(&self) -> usize {
        self.unconsumed
    }

    pub(super) fn ready_len(&self) -> usize {
        self.ready.len()
    }

    fn permitted(&self, gap: u64) -> bool {
        self.max_gap.is_none_or(|n| gap <= n)
    }

    /// Whether a hole of `gap` PDUs may be given up (after the wait).
    fn can_skip(&self, gap: u64) -> bool {
        self.permitted(gap) || !self.rtx
    }

    /// Ends the hole before LWE+1, if one is open, and checks it.
    fn close_gap(&mut self, stats: &mut Stats) {
        if self.open_gap > 0 {
            stats.holes += 1;
            if !self.permitted(self.open_gap) {
                stats.gap_exceeded += 1;
            }
            self.open_gap = 0;
        }
    }

    /// Pops the slot at LWE+1, which is known to be non-empty.
    fn pop_filled(&mut self, stats: &mut Stats) {
        let Some(slot) = self.ring.pop_front() else {
            return;
        };
        let lwe = self.lwe.unwrap_or(0) + 1;
        self.lwe = Some(lwe);
        match slot {
            Slot::Empty => {
                self.open_gap += 1;
                stats.skipped += 1;
            }
            Slot::Held { payload, .. } => {
                self.close_gap(stats);
                self.above -= 1;
                self.ring_held -= 1;
                self.ready.push_back(Delivery { seq: lwe, payload });
            }
            Slot::Seen { .. } => {
                self.close_gap(stats);
                self.above -= 1;
            }
        }
    }

    /// Moves the LWE over every received PDU right after it.
    fn advance(&mut self, stats: &mut Stats) {
        while matches!(
            self.ring.front(),
            Some(Slot::Held { .. } | Slot::Seen { .. })
        ) {
            self.pop_filled(stats);
        }
    }

    /// Gives up every seq up to `target` (delivering what is held).
    fn skip_to(&mut self, target: u64, stats: &mut Stats) {
        while let Some(lwe) = self.lwe {
            if lwe >= target {
                break;
            }
            if self.ring.is_empty() {
                let n = target - lwe;
                self.open_gap += n;
                stats.skipped += n;
                self.lwe = Some(target);
                break;
            }
            self.pop_filled(stats);
        }
        self.advance(stats);
    }

    fn compute_hole_deadline(&self) -> Option<Instant> {
        let lwe = self.lwe?;
        if self.rtx && self.max_gap == Some(0) {
            return None;
        }
        let since = if let Some(at) = self.ring.iter().find_map(Slot::arrived) {
            at
        } else if self.edge > lwe {
            self.edge_at
        } else {
            return None;
        };
        Some(since + self.a_timer)
    }

    fn raise_edge(&mut self, now: Instant, seq: u64) {
        if seq > self.edge {
            self.edge = seq;
            self.edge_at = now;
        }
    }

    fn start_run(&mut self, now: Instant, first: u64, stats: &mut Stats) {
        stats.runs_started += 1;
        self.lwe = Some(first - 1);
        self.edge = first - 1;
        self.edge_at = now;
        self.open_gap = 0;
    }

    /// Ends the live run: hands over what is held (unless the flow tolerates
    /// no loss, in which case PDUs behind a hole are dropped).
    fn end_run(&mut self, stats: &mut Stats) {
        let Some(mut seq) = self.lwe else {
            return;
        };
        let lossless = self.max_gap == Some(0);
        for slot in self.ring.drain(..) {
            seq += 1;
            if let Slot::Held { payload, .. } = slot {
                if lossless {
                    stats.dropped_reset += 1;
                } else {
                    self.ready.push_back(Delivery { seq, payload });
                }
            }
        }
        self.above = 0;
        self.ring_held = 0;
        self.open_gap = 0;
        self.hole_deadline = None;
        self.floor = Some(self.floor.map_or(seq, |f| f.max(seq)));
        self.lwe = None;
    }

    /// Receiver inactivity: no PDU from the peer for 2Δ ends the run.
    pub(super) fn check_inactivity(&mut self, now: Instant, stats: &mut Stats) -> bool {
        if self.lwe.is_some() && now >= self.last_rx + self.inactivity {
            stats.inactivity_resets += 1;
            self.end_run(stats);
            return true;
        }
        false
    }

    /// A data PDU. `ceiling` is the highest sequence number the sender may
    /// have sent by the window rules (see [`super::Connection`]): a PDU at
    /// or below [`Receiver::base`] is a duplicate (or a replay), one above
    /// `ceiling` is dropped as out of window, and neither starts a run nor
    /// keeps one alive.
    pub(super) fn on_data(
        &mut self,
        now: Instant,
        seq: u64,
        drf: bool,
        payload: PduBuf,
        ceiling: u64,
        stats: &mut Stats,
    ) -> RxOutcome {
        self.check_inactivity(now, stats);
        stats.pdus_received += 1;
        if seq == 0 || seq == u64::MAX {
            // Sequence numbers start at 1; 0 can only be garbage. No sender
            // reaches u64::MAX either (2^64 PDUs), and a run based there
            // could take nothing after it: garbage too (a forged PDU with
            // 8-byte sequence numbers).
            stats.duplicates += 1;
            return RxOutcome::Duplicate;
        }
        if let Some(base) = self.base() {
            if seq <= base {
                // A retransmission shows the sender alive; a replay is
                // harmless here.
                self.last_rx = now;
                stats.duplicates += 1;
                return RxOutcome::Duplicate;
            }
            if seq > ceiling && !self.may_resync(now) {
                stats.out_of_window += 1;
                return RxOutcome::OutOfWindow;
            }
        }
        self.last_rx = now;
        let mut started = false;
        match self.lwe {
            None if drf || !self.rtx => {
                // (A PDU past the window that resynchronises the
                // receiver starts the run at itself.)
                let first = if drf || seq > ceiling {
                    seq
                } else {
                    self.resume_from(seq)
                };
                self.start_run(now, first, stats);
                started = true;
            }
            None => {
                // The DRF PDU was lost: hold what follows it (bounded) so the
                // retransmitted DRF PDU brings the whole run in at once.
                if self.prerun.len() < self.max_reorder && !self.prerun.contains_key(&seq) {
                    self.prerun.insert(seq, payload);
                    stats.held_no_run += 1;
                    return RxOutcome::HeldNoRun;
                }
                stats.dropped_no_run += 1;
                return RxOutcome::DroppedNoRun;
            }
            Some(lwe) if drf && !self.rtx && seq > lwe + 1 => {
                // A new run: the sender will never send anything below `seq`.
                // (With retransmission a sender starts a run only with
                // everything acknowledged, so its DRF PDU is always LWE+1:
                // a DRF beyond it is taken as an ordinary PDU of the run.)
                self.end_run(stats);
                self.start_run(now, seq, stats);
            }
            Some(_) => {}
        }
        let outcome = self.accept_in_run(now, seq, payload, stats);
        if started {
            self.replay_prerun(now, stats);
        }
        if matches!(
            outcome,
            RxOutcome::InOrder | RxOutcome::FilledHole | RxOutcome::OutOfOrder
        ) {
            self.last_accept = now;
        }
        outcome
    }

    /// Where a run that PDU `seq` starts without a DRF PDU begins (a flow
    /// without retransmission). A DRF PDU says where; without one (lost,
    /// or overtaken by this PDU on the way), the run begins right after
    /// the highest number known not to be new, at most `max_reorder`
    /// below `seq`: a PDU sent before `seq` that arrives after it is then
    /// taken as a reordered one, not as a duplicate, and what never comes
    /// is given up as any hole is.
    fn resume_from(&self, seq: u64) -> u64 {
        let lowest = seq.saturating_sub(self.max_reorder as u64).max(1);
        match self.floor {
            Some(f) if f < seq => (f + 1).max(lowest),
            _ => seq,
        }
    }

    /// Feeds the PDUs held before the run started into the run.
    fn replay_prerun(&mut self, now: Instant, stats: &mut Stats) {
        for (seq, payload) in std::mem::take(&mut self.prerun) {
            match self.lwe {
                Some(lwe) if seq > lwe => {
                    self.accept_in_run(now, seq, payload, stats);
                }
                _ => stats.duplicates += 1,
            }
        }
    }

    /// The PDU after the LWE of the live run, with nothing held, seen above
    /// it or waiting for delivery, and the run not expired: taken as
    /// [`Receiver::on_data`] takes it, and counted as delivered at once
    /// (the caller hands it over, so it never waits in the ready queue).
    /// False, and nothing changed, for any other PDU, which goes the
    /// general way.
    pub(super) fn take_next(&mut self, now: Instant, seq: u64, stats: &mut Stats) -> bool {
        // u64::MAX is garbage here too, as in `on_data`.
        let next = seq < u64::MAX && self.lwe.is_some_and(|lwe| lwe + 1 == seq);
        if !next
            || self.edge >= seq
            || !self.ring.is_empty()
            || !self.ready.is_empty()
            || now >= self.last_rx + self.inactivity
        {
            return false;
        }
        stats.pdus_received += 1;
        self.last_rx = now;
        self.step_lwe(now, seq, stats);
        self.last_accept = now;
        stats.delivered += 1;
        if self.track_consumption {
            self.unconsumed += 1;
        }
        true
    }

    /// Moves the LWE on to `seq`, the PDU after it, with nothing held
    /// above: what taking the next PDU in order does, whichever way.
    fn step_lwe(&mut self, now: Instant, seq: u64, stats: &mut Stats) {
        self.raise_edge(now, seq);
        self.lwe = Some(seq);
        self.close_gap(stats);
        self.hole_deadline = None;
    }

    /// A data PDU of the live run.
    fn accept_in_run(
        &mut self,
        now: Instant,
        seq: u64,
        payload: PduBuf,
        stats: &mut Stats,
    ) -> RxOutcome {
        if self.ring.is_empty() && self.lwe == Some(seq - 1) {
            // The next PDU with nothing held above it, the one a flow
            // without loss brings every time: what the general case below
            // does for it, without searching the ring.
            self.step_lwe(now, seq, stats);
            self.ready.push_back(Delivery { seq, payload });
            // (A hole is left only if something above was known sent.)
            if self.edge > seq {
                self.hole_deadline = self.compute_hole_deadline();
            }
            return RxOutcome::InOrder;
        }
        let mut lwe = self.lwe.unwrap_or(seq - 1);
        if seq <= lwe {
            stats.duplicates += 1;
            return RxOutcome::Duplicate;
        }
        self.raise_edge(now, seq);
        let mut idx = seq - lwe - 1;
        if idx > self.max_reorder as u64 {
            if self.rtx {
                stats.dropped_queue += 1;
                return RxOutcome::DroppedQueue;
            }
            // Without retransmission the oldest holes can never be filled:
            // give them up to make room rather than drop new data.
            self.skip_to(seq - 1 - self.max_reorder as u64, stats);
            self.hole_deadline = None;
            lwe = self.lwe.unwrap_or(seq - 1);
            idx = seq - lwe - 1;
        }
        let idx = idx as usize;
        if self
            .ring
            .get(idx)
            .is_some_and(|s| !matches!(s, Slot::Empty))
        {
            stats.duplicates += 1;
            return RxOutcome::Duplicate;
        }
        if idx == 0 {
            let filled = !self.ring.is_empty();
            self.ring.pop_front();
            self.lwe = Some(seq);
            self.close_gap(stats);
            self.ready.push_back(Delivery { seq, payload });
            self.advance(stats);
            self.hole_deadline = None;
            self.hole_deadline = self.compute_hole_deadline();
            return if filled {
                RxOutcome::FilledHole
            } else {
                RxOutcome::InOrder
            };
        }
        if self.ring.len() <= idx {
            self.ring.resize_with(idx + 1, || Slot::Empty);
        }
        self.ring[idx] = if self.in_order {
            self.ring_held += 1;
            Slot::Held { payload, at: now }
        } else {
            self.ready.push_back(Delivery { seq, payload });
            Slot::Seen { at: now }
        };
        self.above += 1;
        if self.hole_deadline.is_none() {
            self.hole_deadline = self.compute_hole_deadline();
        }
        RxOutcome::OutOfOrder
    }

    /// A rendezvous: the sender's next sequence number is `next_seq`, so
    /// everything below it was sent. One claiming more than `ceiling + 1`
    /// (beyond the window) or, without a run, less than the floor (a
    /// replay) is counted as invalid and ignored. Returns whether a run is
    /// live (so the receiver can answer).
    pub(super) fn on_rendezvous(
        &mut self,
        now: Instant,
        next_seq: u64,
        ceiling: u64,
        stats: &mut Stats,
    ) -> bool {
        self.check_inactivity(now, stats);
        if next_seq == 0 {
            return self.lwe.is_some();
        }
        let sent = next_seq - 1;
        let stale = self.lwe.is_none() && self.floor.is_some_and(|f| sent < f);
        if (self.base().is_some() && sent > ceiling) || stale {
            stats.ctrl_invalid += 1;
            return false;
        }
        self.last_rx = now;
        if self.lwe.is_none() {
            // Without retransmission, everything before `next_seq` was
            // lost: start the run after it. With it, only if this end took
            // everything the sender sent: its run ended here while its
            // window stayed closed longer than 2Δ (a reader that paused),
            // and unanswered it would wait for a window forever. (Had it
            // sent more, it would be retransmitting, and its retransmitted
            // DRF PDU starts the run.)
            if self.rtx && self.floor != Some(sent) {
                return false;
            }
            self.start_run(now, next_seq, stats);
            return true;
        }
        if sent > self.edge {
            self.raise_edge(now, sent);
            if self.hole_deadline.is_none() {
                self.hole_deadline = self.compute_hole_deadline();
            }
        }
        true
    }

    /// The hole timer: gives up the hole after the LWE if the gap rule
    /// allows it. Returns whether the LWE moved.
    pub(super) fn on_hole_timeout(&mut self, now: Instant, stats: &mut Stats) -> bool {
        if self.hole_deadline.is_none_or(|d| now < d) {
            return false;
        }
        self.hole_deadline = None;
        let Some(lwe) = self.lwe else {
            return false;
        };
        let lead = if self.ring.is_empty() {
            self.edge.saturating_sub(lwe)
        } else {
            self.ring
                .iter()
                .take_while(|s| matches!(s, Slot::Empty))
                .count() as u64
        };
        if lead == 0 || !self.can_skip(self.open_gap + lead) {
            return false;
        }
        self.skip_to(lwe + lead, stats);
        self.hole_deadline = self.compute_hole_deadline();
        true
    }
}
