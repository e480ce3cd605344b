//! DTP sending side and DTCP sender policies: sequencing, data runs, the
//! closed-window queue, window and rate flow control, rendezvous, and
//! retransmission control with cumulative acks.
//!
//! Retransmission (NewReno-like, without congestion control): one timer for
//! the oldest unacknowledged PDU; when it fires, the oldest PDU is resent,
//! the RTO backs off and the sender enters recovery until everything sent so
//! far is acknowledged. In recovery every ack that advances but stops short
//! (a partial ack) resends the next oldest PDU at once, so a window with
//! several losses recovers one hole per round trip instead of one per RTO.
//! Three duplicate acks (same ack, no window change) trigger the same
//! recovery without waiting for the timer.
//!
//! With congestion control ([`super::cc`]) the sender also takes nacks: a
//! receiver names each sequence number it finds missing (once, when a later
//! PDU reveals the hole), and the sender resends exactly that PDU, so one
//! loss costs one retransmission whatever else is in flight. A PDU is not
//! resent again while its last copy may still be in flight (within
//! 5/4·SRTT + 2·RTTVAR); a retransmission that was lost itself is resent
//! when duplicate acks keep naming its hole after that time. Acks that
//! name the data PDU that caused them (`echo`) give an RTT sample even
//! while a hole holds the cumulative ack back, so the estimate survives
//! loss (Karn's rule applies per named PDU).

use super::cc::Congestion;
use super::config::{EfcpConfig, RateFc, RtxConfig, WindowFc};
use super::rtt::RttEstimator;
use super::{EfcpError, Pdu, Stats};
use crate::buf::PduBuf;
use crate::time::Instant;
use std::collections::VecDeque;
use std::time::Duration;

/// Duplicate acks that trigger a fast retransmission.
const DUP_ACK_THRESHOLD: u32 = 3;
/// Most doublings of the rendezvous interval.
const MAX_RENDEZVOUS_BACKOFF: u32 = 6;

/// A sent PDU kept for retransmission.
#[derive(Debug)]
struct Sent {
    drf: bool,
    payload: PduBuf,
    sent_at: Instant,
    retransmitted: bool,
    retries: u32,
    /// An RTT sample was taken from an ack naming it.
    sampled: bool,
    /// An ack named it: the receiver has it (above a hole).
    delivered: bool,
}

/// The sending half of an EFCP connection.
#[derive(Debug)]
pub(super) struct Sender {
    rtx_cfg: Option<RtxConfig>,
    window: Option<WindowFc>,
    rate: Option<RateFc>,
    max_send_queue: usize,
    inflight_limit: usize,
    /// Most PDUs kept for retransmission with window flow control: twice
    /// what a receiver of the same cube can have open
    /// ([`EfcpConfig::seq_span`]), the slack [`Sender::valid_rwe`] allows.
    /// A peer granting credit ahead of its acks holds no more than this.
    max_unacked: usize,
    delta: Duration,
    a_timer: Duration,
    next_seq: u64,
    /// SDUs written, not yet sent (the closed-window queue).
    queue: VecDeque<PduBuf>,
    /// Sent and not acknowledged, seqs `snd_una..next_seq` (with rtx).
    unacked: VecDeque<Sent>,
    snd_una: u64,
    /// Highest seq the receiver allows (window flow control).
    snd_rwe: u64,
    frame_start: Instant,
    frame_sent: u64,
    rtt: RttEstimator,
    rtx_deadline: Option<Instant>,
    /// Seqs to resend at the next opportunity.
    rtx_pending: VecDeque<u64>,
    recovery: Option<u64>,
    dup_acks: u32,
    rdv_deadline: Option<Instant>,
    rdv_backoff: u32,
    rdv_due: bool,
    last_data_tx: Option<Instant>,
    failure: Option<EfcpError>,
    /// Congestion control, if configured.
    cc: Option<Congestion>,
    /// New data waited for the congestion window since the last ack.
    cwnd_limited: bool,
    /// Unacknowledged PDUs an ack named as received (above a hole): not in
    /// flight any more, so not counted against the congestion window.
    delivered_above: usize,
}

impl Sender {
    pub(super) fn new(cfg: &EfcpConfig, now: Instant, initial_seq: u64) -> Self {
        let rtx_cfg = cfg.rtx().copied();
        let rtt = match &rtx_cfg {
            Some(r) => RttEstimator::new(r.initial_rto, r.min_rto, r.max_rto),
            None => RttEstimator::new(Duration::ZERO, Duration::ZERO, Duration::ZERO),
        };
        let window = cfg.window().copied();
        Sender {
            rtx_cfg,
            window,
            rate: cfg.rate().copied(),
            max_send_queue: cfg.max_send_queue,
            inflight_limit: cfg.max_reorder.saturating_add(1),
            max_unacked: cfg.seq_span().map_or(usize::MAX, |s| {
                usize::try_from(s.saturating_mul(2)).unwrap_or(usize::MAX)
            }),
            delta: cfg.delta_t(),
            a_timer: cfg.a_timer,
            next_seq: initial_seq,
            queue: VecDeque::new(),
            unacked: VecDeque::new(),
            snd_una: initial_seq,
            snd_rwe: (initial_seq - 1).saturating_add(window.map_or(0, |w| w.initial_credit)),
            frame_start: now,
            frame_sent: 0,
            rtt,
            rtx_deadline: None,
            rtx_pending: VecDeque::new(),
            recovery: None,
            dup_acks: 0,
            rdv_deadline: None,
            rdv_backoff: 0,
            rdv_due: false,
            last_data_tx: None,
            failure: None,
            cc: cfg
                .cc()
                .filter(|_| rtx_cfg.is_some())
                .map(|c| Congestion::new(*c, initial_seq)),
            cwnd_limited: false,
            delivered_above: 0,
        }
    }

    /// The congestion controller's state, if there is one.
    pub(super) fn cc_state(&self) -> Option<&super::cc::CcState> {
        self.cc.as_ref().map(|c| c.state())
    }

    pub(super) fn failure(&self) -> Option<&EfcpError> {
        self.failure.as_ref()
    }

    pub(super) fn rtt(&self) -> &RttEstimator {
        &self.rtt
    }

    pub(super) fn next_seq(&self) -> u64 {
        self.next_seq
    }

    pub(super) fn snd_rwe(&self) -> Option<u64> {
        self.window.map(|_| self.snd_rwe)
    }

    pub(super) fn queued(&self) -> usize {
        self.queue.len()
    }

    pub(super) fn in_flight(&self) -> usize {
        self.unacked.len()
    }

    fn capacity(&self) -> usize {
        match &self.window {
            Some(w) => {
                let open = self
                    .snd_rwe
                    .saturating_add(1)
                    .saturating_sub(self.next_seq)
                    .min(usize::MAX as u64) as usize;
                w.max_closed_queue.saturating_add(open)
            }
            None => self.max_send_queue,
        }
    }

    pub(super) fn can_write(&self) -> bool {
        self.failure.is_none() && self.queue.len() < self.capacity()
    }

    /// Fragments [`Sender::write`] would take now without refusing.
    pub(super) fn write_capacity(&self) -> usize {
        if self.failure.is_some() {
            return 0;
        }
        self.capacity().saturating_sub(self.queue.len())
    }

    pub(super) fn write(&mut self, payload: PduBuf, stats: &mut Stats) -> Result<(), EfcpError> {
        if self.failure.is_some() {
            return Err(EfcpError::Closed);
        }
        if self.queue.len() >= self.capacity() {
            stats.would_block += 1;
            return Err(EfcpError::WouldBlock);
        }
        self.queue.push_back(payload);
        Ok(())
    }

    /// Whether flow control (the receiver's window) lets a new PDU go.
    fn window_open(&self) -> bool {
        match &self.window {
            Some(_) => self.next_seq <= self.snd_rwe,
            None => self.rtx_cfg.is_none() || self.unacked.len() < self.inflight_limit,
        }
    }

    /// Whether congestion control lets a new PDU go.
    fn cwnd_open(&self) -> bool {
        self.cc.as_ref().is_none_or(|c| self.pipe() < c.window())
    }

    /// PDUs in flight as far as the sender knows: unacknowledged and not
    /// named as received.
    fn pipe(&self) -> usize {
        self.unacked.len().saturating_sub(self.delivered_above)
    }

    /// How long a retransmitted PDU may still be in flight.
    fn rtx_in_flight_time(&self) -> Duration {
        match self.rtt.srtt() {
            Some(s) => s * 5 / 4 + self.rtt.rttvar() * 2,
            None => self.rtt.rto(),
        }
    }

    fn roll_frame(&mut self, now: Instant) {
        if let Some(r) = &self.rate {
            let frame = r.frame.as_nanos().max(1);
            let elapsed = (now - self.frame_start).as_nanos();
            if elapsed >= frame {
                let k = elapsed / frame;
                let step = u64::try_from(k * frame).unwrap_or(u64::MAX);
                self.frame_start =
                    Instant::from_nanos(self.frame_start.as_nanos().saturating_add(step));
                self.frame_sent = 0;
            }
        }
    }

    fn rate_ok(&mut self, now: Instant) -> bool {
        self.roll_frame(now);
        self.rate.is_none_or(|r| self.frame_sent < r.pdus_per_frame)
    }

    fn rate_blocked(&self) -> bool {
        self.rate
            .is_some_and(|r| self.frame_sent >= r.pdus_per_frame)
    }

    fn rdv_interval(&self) -> Duration {
        let base = if self.rtx_cfg.is_some() {
            self.rtt.rto()
        } else {
            (self.a_timer * 2).max(Duration::from_millis(1))
        };
        base.saturating_mul(1 << self.rdv_backoff)
    }

    fn arm_rtx(&mut self, now: Instant) {
        if self.rtx_deadline.is_none() {
            self.rtx_deadline = Some(now + self.rtt.rto());
        }
    }

    /// The next data PDU to send (retransmission first), if flow control
    /// allows one now.
    pub(super) fn poll_data(&mut self, now: Instant, stats: &mut Stats) -> Option<Pdu> {
        if self.failure.is_some() {
            return None;
        }
        while let Some(&seq) = self.rtx_pending.front() {
            if seq < self.snd_una {
                self.rtx_pending.pop_front();
                continue;
            }
            if !self.rate_ok(now) {
                return None;
            }
            self.rtx_pending.pop_front();
            let Some(e) = self.unacked.get_mut((seq - self.snd_una) as usize) else {
                continue;
            };
            e.retries += 1;
            e.retransmitted = true;
            e.sent_at = now;
            let pdu = Pdu::Data {
                seq,
                drf: e.drf,
                payload: e.payload.clone(),
            };
            self.frame_sent += 1;
            stats.pdus_retransmitted += 1;
            self.last_data_tx = Some(now);
            self.arm_rtx(now);
            return Some(pdu);
        }
        if self.queue.is_empty() {
            return None;
        }
        if !self.window_open() {
            if self.window.is_some() && self.rdv_deadline.is_none() {
                self.rdv_deadline = Some(now + self.rdv_interval());
            }
            return None;
        }
        if self.rtx_cfg.is_some() && self.unacked.len() >= self.max_unacked {
            // The acks bring this down; the RTO timer is armed.
            return None;
        }
        if !self.cwnd_open() {
            self.cwnd_limited = true;
            return None;
        }
        if !self.rate_ok(now) {
            return None;
        }
        let payload = self.queue.pop_front()?;
        let (seq, drf) = self.number(now, stats);
        if self.rtx_cfg.is_some() {
            self.unacked.push_back(Sent {
                drf,
                payload: payload.clone(),
                sent_at: now,
                retransmitted: false,
                retries: 0,
                sampled: false,
                delivered: false,
            });
            self.arm_rtx(now);
        } else {
            self.snd_una = self.next_seq;
        }
        Some(Pdu::Data { seq, drf, payload })
    }

    /// Numbers the next data PDU: its sequence number, and whether it
    /// starts a new run (DRF).
    fn number(&mut self, now: Instant, stats: &mut Stats) -> (u64, bool) {
        let seq = self.next_seq;
        self.next_seq += 1;
        // Sender inactivity: after Δ with nothing sent and nothing
        // outstanding, start a new data run (see the module docs).
        let drf = match self.last_data_tx {
            None => true,
            Some(t) => self.unacked.is_empty() && now - t >= self.delta,
        };
        if drf {
            stats.runs_sent += 1;
        }
        self.frame_sent += 1;
        self.last_data_tx = Some(now);
        stats.pdus_sent += 1;
        (seq, drf)
    }

    /// For a sender without retransmission, window, rate or congestion
    /// control, with nothing queued: numbers a data PDU that goes out at
    /// once instead of through the queue, as [`Sender::poll_data`] would
    /// have numbered it had it been queued and polled now. `None` (nothing
    /// changed) when the sender is failed or has anything queued.
    pub(super) fn number_direct(&mut self, now: Instant, stats: &mut Stats) -> Option<(u64, bool)> {
        debug_assert!(self.rtx_cfg.is_none() && self.window.is_none() && self.cc.is_none());
        if self.failure.is_some() || !self.queue.is_empty() || !self.rtx_pending.is_empty() {
            return None;
        }
        if !self.rate_ok(now) {
            return None;
        }
        let numbered = self.number(now, stats);
        self.snd_una = self.next_seq;
        Some(numbered)
    }

    /// A rendezvous to send, if the window has been closed too long.
    pub(super) fn take_rendezvous(&mut self) -> Option<u64> {
        if std::mem::take(&mut self.rdv_due) && self.failure.is_none() {
            Some(self.next_seq)
        } else {
            None
        }
    }

    /// Whether an ack could come from the peer: only a retransmitting
    /// sender takes acks, and nothing at or past the next seq was sent.
    pub(super) fn valid_ack(&self, ack_sn: u64) -> bool {
        self.rtx_cfg.is_some() && ack_sn < self.next_seq
    }

    /// Whether a right window edge could have been granted: a receiver
    /// grants at most its buffer plus its reordering queue past its LWE,
    /// which is below our next seq. The peer runs the same QoS cube, so our
    /// own figures bound it (doubled, for slack).
    pub(super) fn valid_rwe(&self, new_rwe: u64) -> bool {
        let Some(w) = &self.window else {
            return true;
        };
        let most = (w.receiver_buffer as u64)
            .max(w.initial_credit)
            .saturating_add(self.inflight_limit as u64)
            .saturating_mul(2);
        new_rwe <= (self.next_seq - 1).saturating_add(most)
    }

    /// A window / rate update from the peer. Returns whether the window
    /// grew. A rate is taken only from a `fresh` PDU and only by a
    /// rate-controlled sender (the peer runs the same cube; a connection
    /// without rate control is not slowed by a PDU claiming one).
    pub(super) fn on_fc(&mut self, new_rwe: u64, rate: u64, frame_ms: u64, fresh: bool) -> bool {
        if fresh && rate > 0 && frame_ms > 0 {
            let frame = Duration::from_millis(frame_ms);
            let tighter = match &self.rate {
                None => false,
                // rate/frame < ours/our_frame
                Some(r) => {
                    (rate as u128).saturating_mul(r.frame.as_nanos())
                        < (r.pdus_per_frame as u128).saturating_mul(frame.as_nanos())
                }
            };
            if tighter {
                self.rate = Some(RateFc {
                    pdus_per_frame: rate,
                    frame,
                });
            }
        }
        if self.window.is_some() && new_rwe > self.snd_rwe {
            self.snd_rwe = new_rwe;
            self.rdv_deadline = None;
            self.rdv_backoff = 0;
            return true;
        }
        false
    }

    /// A cumulative ack: every seq up to `ack_sn` arrived (or was given up).
    /// A stale one (not `fresh`) only counts if it advances. `ece`: the
    /// PDUs it covers carried congestion marks; `echo`: the data PDU whose
    /// arrival caused it, if the ack names one.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn on_ack(
        &mut self,
        now: Instant,
        ack_sn: u64,
        window_grew: bool,
        fresh: bool,
        ece: bool,
        echo: Option<u64>,
        stats: &mut Stats,
    ) {
        let Some(rtx) = self.rtx_cfg else {
            return;
        };
        if ack_sn >= self.next_seq {
            stats.ctrl_invalid += 1;
            return;
        }
        let named = fresh && self.sample_named(now, echo);
        if ack_sn >= self.snd_una {
            let limited = std::mem::take(&mut self.cwnd_limited)
                || self.cc.as_ref().is_some_and(|c| self.pipe() >= c.window());
            let acked = ack_sn + 1 - self.snd_una;
            let mut any_rtx = false;
            let mut newest = None;
            while self.snd_una <= ack_sn {
                if let Some(e) = self.unacked.pop_front() {
                    any_rtx |= e.retransmitted;
                    newest = Some(e.sent_at);
                    self.delivered_above -= usize::from(e.delivered);
                }
                self.snd_una += 1;
            }
            // Karn's rule, over the whole acked range: an ack that covers
            // a retransmitted PDU says nothing certain about the RTT.
            if let (false, false, Some(t)) = (named || echo.is_some(), any_rtx, newest) {
                self.rtt.sample(now - t);
                if let Some(cc) = &mut self.cc {
                    cc.on_rtt_sample(now - t);
                }
            }
            self.rtt.reset_backoff();
            self.dup_acks = 0;
            self.rtx_deadline = if self.unacked.is_empty() {
                None
            } else {
                Some(now + self.rtt.rto())
            };
            if let Some(cc) = &mut self.cc {
                cc.on_ack(now, ack_sn, acked, ece, limited, self.next_seq);
            }
            match self.recovery {
                Some(rec) if ack_sn >= rec => self.recovery = None,
                Some(_) => {
                    // Partial ack: the next hole is at snd_una.
                    self.schedule_rtx(now, self.snd_una, false, rtx.max_retries, stats);
                }
                None => {}
            }
            self.front_lost(now, echo, rtx.max_retries, stats);
        } else if fresh && ack_sn + 1 == self.snd_una && !self.unacked.is_empty() && !window_grew {
            if let Some(cc) = &mut self.cc {
                cc.on_ack(now, ack_sn, 0, ece, false, self.next_seq);
            }
            self.on_dup_ack(now, rtx.max_retries, stats);
            self.front_lost(now, echo, rtx.max_retries, stats);
        }
    }

    /// With congestion control: the oldest unacknowledged PDU is lost (or
    /// its retransmission was) if an ack names a later PDU as received
    /// and the oldest was sent longer ago than a copy may be in flight.
    fn front_lost(&mut self, now: Instant, echo: Option<u64>, max_retries: u32, stats: &mut Stats) {
        if self.cc.is_none() || echo.is_none_or(|e| e <= self.snd_una) {
            return;
        }
        let late = self
            .unacked
            .front()
            .is_some_and(|e| now - e.sent_at >= self.rtx_in_flight_time());
        if late {
            self.schedule_rtx(now, self.snd_una, false, max_retries, stats);
        }
    }

    fn on_dup_ack(&mut self, now: Instant, max_retries: u32, stats: &mut Stats) {
        self.dup_acks += 1;
        if self.dup_acks == DUP_ACK_THRESHOLD && self.recovery.is_none() {
            stats.fast_retransmits += 1;
            self.recovery = Some(self.next_seq - 1);
            let srtt = self.rtt.srtt();
            if let Some(cc) = &mut self.cc {
                cc.on_loss(now, self.snd_una, srtt, self.next_seq);
            }
            self.schedule_rtx(now, self.snd_una, false, max_retries, stats);
        } else if self.dup_acks > DUP_ACK_THRESHOLD && self.cc.is_some() {
            // The hole at snd_una is still open: if its retransmission
            // should have arrived by now, it was lost too.
            let lost = self
                .unacked
                .front()
                .is_some_and(|e| e.retransmitted && now - e.sent_at >= self.rtx_in_flight_time());
            if lost {
                self.schedule_rtx(now, self.snd_una, false, max_retries, stats);
            }
        }
    }

    /// Takes an RTT sample from an ack naming the data PDU `echo` that
    /// caused it, if that PDU was sent once and not sampled yet. Returns
    /// whether a sample was taken.
    fn sample_named(&mut self, now: Instant, echo: Option<u64>) -> bool {
        let Some(echo) = echo else {
            return false;
        };
        if echo < self.snd_una || echo >= self.next_seq {
            return false;
        }
        let Some(e) = self.unacked.get_mut((echo - self.snd_una) as usize) else {
            return false;
        };
        if !e.delivered {
            e.delivered = true;
            self.delivered_above += 1;
        }
        if e.retransmitted || e.sampled {
            return false;
        }
        e.sampled = true;
        let r = now - e.sent_at;
        self.rtt.sample(r);
        if let Some(cc) = &mut self.cc {
            cc.on_rtt_sample(r);
        }
        true
    }

    /// Whether a nack could come from the peer.
    pub(super) fn valid_nack(&self, nack_sn: u64) -> bool {
        self.rtx_cfg.is_some() && nack_sn < self.next_seq
    }

    /// The receiver found `nack_sn` missing: resend it (once per flight).
    pub(super) fn on_nack(&mut self, now: Instant, nack_sn: u64, stats: &mut Stats) {
        let Some(rtx) = self.rtx_cfg else {
            return;
        };
        if nack_sn < self.snd_una || nack_sn >= self.next_seq {
            return;
        }
        let srtt = self.rtt.srtt();
        if let Some(cc) = &mut self.cc {
            cc.on_loss(now, nack_sn, srtt, self.next_seq);
        }
        self.schedule_rtx(now, nack_sn, false, rtx.max_retries, stats);
    }

    /// Queues `seq` for retransmission; unless `force`, not while its last
    /// retransmission may still be in flight.
    fn schedule_rtx(
        &mut self,
        now: Instant,
        seq: u64,
        force: bool,
        max_retries: u32,
        stats: &mut Stats,
    ) {
        let recent = self.rtx_in_flight_time();
        let Some(e) = self.unacked.get((seq.wrapping_sub(self.snd_una)) as usize) else {
            return;
        };
        if !force && e.retransmitted && now - e.sent_at < recent {
            return;
        }
        if e.retries >= max_retries {
            self.fail(seq, e.retries, stats);
            return;
        }
        if !self.rtx_pending.contains(&seq) {
            self.rtx_pending.push_back(seq);
        }
    }

    fn fail(&mut self, seq: u64, retries: u32, stats: &mut Stats) {
        stats.failures += 1;
        self.failure = Some(EfcpError::RetriesExhausted { seq, retries });
        self.queue.clear();
        self.unacked.clear();
        self.delivered_above = 0;
        self.rtx_pending.clear();
        self.rtx_deadline = None;
        self.rdv_deadline = None;
        self.rdv_due = false;
    }

    pub(super) fn poll_timeout(&self) -> Option<Instant> {
        if self.failure.is_some() {
            return None;
        }
        let rate = match &self.rate {
            Some(r)
                if self.rate_blocked()
                    && (!self.queue.is_empty() || !self.rtx_pending.is_empty()) =>
            {
                Some(self.frame_start + r.frame)
            }
            _ => None,
        };
        [self.rtx_deadline, self.rdv_deadline, rate]
            .into_iter()
            .flatten()
            .min()
    }

    pub(super) fn handle_timeout(&mut self, now: Instant, stats: &mut Stats) {
        if self.failure.is_some() {
            return;
        }
        // A frame that ended frees the rate, whatever else blocks: its end,
        // left in the past while the window stays shut, was a deadline due
        // for ever (the driver spun).
        self.roll_frame(now);
        if self.rtx_deadline.is_some_and(|d| now >= d) {
            self.on_rto(now, stats);
        }
        if self.rdv_deadline.is_some_and(|d| now >= d) {
            if !self.queue.is_empty() && !self.window_open() {
                self.rdv_due = true;
                stats.rendezvous_sent += 1;
                self.rdv_backoff = (self.rdv_backoff + 1).min(MAX_RENDEZVOUS_BACKOFF);
                self.rdv_deadline = Some(now + self.rdv_interval());
            } else {
                self.rdv_deadline = None;
                self.rdv_backoff = 0;
            }
        }
    }

    fn on_rto(&mut self, now: Instant, stats: &mut Stats) {
        let Some(rtx) = self.rtx_cfg else {
            self.rtx_deadline = None;
            return;
        };
        let Some(front) = self.unacked.front() else {
            self.rtx_deadline = None;
            return;
        };
        stats.rto_expirations += 1;
        if front.retries >= rtx.max_retries {
            let retries = front.retries;
            self.fail(self.snd_una, retries, stats);
            return;
        }
        self.rtt.backoff();
        self.dup_acks = 0;
        self.recovery = Some(self.next_seq - 1);
        let srtt = self.rtt.srtt();
        if let Some(cc) = &mut self.cc {
            cc.on_timeout(now, srtt, self.next_seq);
        }
        if !self.rtx_pending.contains(&self.snd_una) {
            self.rtx_pending.push_back(self.snd_una);
        }
        self.rtx_deadline = Some(now + self.rtt.rto());
    }
}
