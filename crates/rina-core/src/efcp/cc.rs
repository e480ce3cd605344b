//! Congestion control of a retransmitting DTCP sender: a congestion window
//! (in PDUs) on top of the receiver's window, driven by explicit congestion
//! marks and by losses.
//!
//! Two policies ([`CcPolicy`]):
//!
//! * **DCTCP-like** ([`CcPolicy::Dctcp`], the default of the reliable cube):
//!   the receiver echoes, on each ack, whether the PDUs it covers carried
//!   the ECN flag an RMT set because its queue passed the marking
//!   threshold. Per window of data the sender measures the fraction F of
//!   acknowledged PDUs that were marked and keeps α ← (1 − g)·α + g·F; on
//!   the first echoed mark of a window it reduces `cwnd ← cwnd·(1 − α/2)`
//!   (at most once per window). Growth: slow start (one PDU per PDU acked)
//!   up to `ssthresh`, then one PDU per window (additive increase).
//! * **AIMD** ([`CcPolicy::Aimd`], rlite's and TCP Reno's answer): a mark
//!   or a loss halves the window, once per window.
//!
//! Losses. Where the RMTs mark, congestion shows as marks long before a
//! queue overflows, so a loss is damage on a link rather than congestion
//! (the argument of the RINA congestion-control work of Teymoori, Welzl et
//! al.: every DIF marks, so ECN can be the signal). The DCTCP-like policy
//! therefore takes a loss as congestion (halving the window, once per
//! window) only when the path shows a queue that does not mark: no marked
//! ack within the last [`CcConfig::ecn_memory_rtts`] round trips, and a
//! smoothed RTT above the smallest RTT seen by more than a quarter of it
//! (at least 1 ms; TCP Veno's test of random against congestive loss). A
//! bottleneck that drops without marking (a kernel qdisc below a shim)
//! fills its queue first, so the flow still backs off there like Reno,
//! while random loss on an idle path costs no window. A retransmission
//! timeout of a congestive loss resets the window to
//! [`CcConfig::min_window`]; otherwise it is treated like any loss.

use crate::time::Instant;
use std::time::Duration;

/// Which congestion-control policy a retransmitting sender runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CcPolicy {
    /// Window reduction proportional to the fraction of marked PDUs
    /// (DCTCP, RFC 8257), additive increase; losses count as congestion
    /// only where no marks are seen.
    Dctcp,
    /// Halve on a mark or a loss, once per window; add one PDU per window.
    Aimd,
}

/// Parameters of congestion control.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CcConfig {
    /// The policy.
    pub policy: CcPolicy,
    /// Congestion window at the start, in PDUs.
    pub initial_window: u64,
    /// Smallest congestion window, in PDUs (at least 1).
    pub min_window: u64,
    /// Largest congestion window, in PDUs.
    pub max_window: u64,
    /// DCTCP's gain g = 2^-`gain_shift` for the moving average of the
    /// marked fraction (0..=10).
    pub gain_shift: u32,
    /// How long, in smoothed round trips, an echoed mark shows that the
    /// path marks (so that a loss in that time is taken as damage).
    pub ecn_memory_rtts: u32,
}

impl Default for CcConfig {
    /// DCTCP-like, initial window 10 (RFC 6928), minimum 2, maximum 4096,
    /// g = 1/16 (RFC 8257), marks remembered for 8 round trips.
    fn default() -> Self {
        CcConfig {
            policy: CcPolicy::Dctcp,
            initial_window: 10,
            min_window: 2,
            max_window: 4096,
            gain_shift: 4,
            ecn_memory_rtts: 8,
        }
    }
}

impl CcConfig {
    /// The same with the AIMD policy.
    pub fn aimd() -> Self {
        CcConfig {
            policy: CcPolicy::Aimd,
            ..CcConfig::default()
        }
    }

    /// Whether the parameters can work.
    pub(super) fn valid(&self) -> bool {
        self.min_window >= 1
            && self.min_window <= self.initial_window
            && self.initial_window <= self.max_window
            && self.gain_shift <= 10
    }
}

/// Counters of congestion control, for listings.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CcState {
    /// Congestion window, in PDUs.
    pub cwnd: f64,
    /// Slow-start threshold, in PDUs.
    pub ssthresh: f64,
    /// DCTCP's moving average of the marked fraction.
    pub alpha: f64,
    /// Acks that echoed congestion marks.
    pub marked_acks: u64,
    /// Window reductions for marks.
    pub ecn_reductions: u64,
    /// Window reductions for losses.
    pub loss_reductions: u64,
    /// Losses taken as damage (marks seen recently), not congestion.
    pub losses_ignored: u64,
}

/// The congestion controller of one sender.
#[derive(Debug, Clone)]
pub(super) struct Congestion {
    cfg: CcConfig,
    st: CcState,
    /// Sequence number that ends the current observation window.
    win_end: u64,
    win_acked: u64,
    win_marked: u64,
    /// No reduction until the ack passes this sequence number.
    reduced_until: u64,
    last_mark: Option<Instant>,
    /// Smallest RTT sample.
    min_rtt: Option<Duration>,
}

impl Congestion {
    pub(super) fn new(cfg: CcConfig, initial_seq: u64) -> Self {
        Congestion {
            st: CcState {
                cwnd: cfg.initial_window as f64,
                ssthresh: cfg.max_window as f64,
                alpha: 1.0,
                ..CcState::default()
            },
            cfg,
            win_end: initial_seq,
            win_acked: 0,
            win_marked: 0,
            reduced_until: initial_seq.saturating_sub(1),
            last_mark: None,
            min_rtt: None,
        }
    }

    /// An RTT sample was taken.
    pub(super) fn on_rtt_sample(&mut self, r: Duration) {
        self.min_rtt = Some(self.min_rtt.map_or(r, |m| m.min(r)));
    }

    /// Whether a loss now is congestion: a queue that does not mark.
    fn congestive(&self, now: Instant, srtt: Option<Duration>) -> bool {
        if self.cfg.policy == CcPolicy::Aimd {
            return true;
        }
        if self.marks_recently(now, srtt) {
            return false;
        }
        match (self.min_rtt, srtt) {
            (Some(min), Some(srtt)) => srtt > min + (min / 4).max(Duration::from_millis(1)),
            _ => true,
        }
    }

    /// The counters and window.
    pub(super) fn state(&self) -> &CcState {
        &self.st
    }

    /// Most PDUs in flight now.
    pub(super) fn window(&self) -> usize {
        self.st.cwnd.floor().max(1.0) as usize
    }

    /// `acked` new PDUs were acknowledged up to `ack_sn`, by an ack that
    /// echoed marks (`ece`) or not; `limited` says the window was full (so
    /// growth is earned); `next_seq` is the next seq to send.
    pub(super) fn on_ack(
        &mut self,
        now: Instant,
        ack_sn: u64,
        acked: u64,
        ece: bool,
        limited: bool,
        next_seq: u64,
    ) {
        if ece {
            self.st.marked_acks += 1;
            self.last_mark = Some(now);
            self.win_marked += acked;
        }
        self.win_acked += acked;
        if ack_sn >= self.win_end {
            if self.cfg.policy == CcPolicy::Dctcp && self.win_acked > 0 {
                let f = self.win_marked as f64 / self.win_acked as f64;
                let g = 1.0 / f64::from(1u32 << self.cfg.gain_shift.min(10));
                self.st.alpha = (1.0 - g) * self.st.alpha + g * f.min(1.0);
            }
            self.win_acked = 0;
            self.win_marked = 0;
            self.win_end = next_seq;
        }
        if ece && ack_sn > self.reduced_until {
            let factor = match self.cfg.policy {
                CcPolicy::Dctcp => 1.0 - self.st.alpha / 2.0,
                CcPolicy::Aimd => 0.5,
            };
            self.reduce(factor, next_seq);
            self.st.ecn_reductions += 1;
            return;
        }
        if !limited || acked == 0 {
            return;
        }
        let max = self.cfg.max_window as f64;
        if self.st.cwnd < self.st.ssthresh {
            self.st.cwnd = (self.st.cwnd + acked as f64).min(self.st.ssthresh.max(1.0));
        } else {
            self.st.cwnd += acked as f64 / self.st.cwnd.max(1.0);
        }
        self.st.cwnd = self.st.cwnd.min(max);
    }

    fn reduce(&mut self, factor: f64, next_seq: u64) {
        let min = self.cfg.min_window as f64;
        self.st.cwnd = (self.st.cwnd * factor).max(min);
        self.st.ssthresh = self.st.cwnd;
        self.reduced_until = next_seq.saturating_sub(1);
    }

    /// Whether the path marked recently: a loss is then damage.
    fn marks_recently(&self, now: Instant, srtt: Option<Duration>) -> bool {
        if self.cfg.policy != CcPolicy::Dctcp {
            return false;
        }
        let (Some(t), Some(srtt)) = (self.last_mark, srtt) else {
            return false;
        };
        now - t <= srtt.saturating_mul(self.cfg.ecn_memory_rtts)
    }

    /// PDU `seq` was found lost (by a nack or duplicate acks).
    pub(super) fn on_loss(
        &mut self,
        now: Instant,
        seq: u64,
        srtt: Option<Duration>,
        next_seq: u64,
    ) {
        if seq <= self.reduced_until {
            return;
        }
        if !self.congestive(now, srtt) {
            self.st.losses_ignored += 1;
            self.reduced_until = next_seq.saturating_sub(1);
            return;
        }
        self.reduce(0.5, next_seq);
        self.st.loss_reductions += 1;
    }

    /// The retransmission timer fired.
    pub(super) fn on_timeout(&mut self, now: Instant, srtt: Option<Duration>, next_seq: u64) {
        if !self.congestive(now, srtt) {
            self.st.losses_ignored += 1;
            return;
        }
        self.st.ssthresh = (self.st.cwnd / 2.0).max(self.cfg.min_window as f64);
        self.st.cwnd = self.cfg.min_window as f64;
        self.reduced_until = next_seq.saturating_sub(1);
        self.st.loss_reductions += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Instant {
        Instant::from_nanos(v * 1_000_000)
    }

    #[test]
    fn slow_start_then_additive_increase() {
        let mut c = Congestion::new(CcConfig::default(), 1);
        c.on_ack(ms(1), 10, 10, false, true, 11);
        assert_eq!(c.window(), 20);
        c.st.ssthresh = 20.0;
        for i in 0..41 {
            c.on_ack(ms(2), 11 + i, 1, false, true, 60);
        }
        assert_eq!(c.window(), 20 + 1, "about one PDU per window");
    }

    #[test]
    fn no_growth_when_not_window_limited() {
        let mut c = Congestion::new(CcConfig::default(), 1);
        c.on_ack(ms(1), 5, 5, false, false, 6);
        assert_eq!(c.window(), 10);
    }

    #[test]
    fn dctcp_reduces_in_proportion_to_the_marked_fraction_once_per_window() {
        let mut c = Congestion::new(CcConfig::default(), 1);
        c.st.cwnd = 100.0;
        c.st.alpha = 0.2;
        // The window ends: alpha = 15/16 * 0.2 + 1/16 * 1 (all marked).
        c.on_ack(ms(1), 10, 10, true, true, 101);
        assert!((c.st.alpha - 0.25).abs() < 1e-9, "{}", c.st.alpha);
        assert!((c.st.cwnd - 87.5).abs() < 1e-9, "{}", c.st.cwnd);
        // The same window: no second reduction.
        c.on_ack(ms(1), 20, 10, true, false, 101);
        assert!((c.st.cwnd - 87.5).abs() < 1e-9);
        assert_eq!(c.st.ecn_reductions, 1);
    }

    #[test]
    fn alpha_tracks_the_marked_fraction() {
        let mut c = Congestion::new(CcConfig::default(), 1);
        c.st.alpha = 0.0;
        // Windows of 10 PDUs with none marked keep alpha at 0.
        for w in 0..10u64 {
            c.on_ack(ms(w), 10 * (w + 1), 10, false, true, 10 * (w + 1) + 1);
        }
        assert_eq!(c.st.alpha, 0.0);
    }

    #[test]
    fn aimd_halves_on_marks_and_losses() {
        let mut c = Congestion::new(CcConfig::aimd(), 1);
        c.st.cwnd = 40.0;
        c.on_ack(ms(1), 5, 5, true, true, 41);
        assert_eq!(c.window(), 20);
        c.on_loss(ms(2), 60, Some(Duration::from_millis(10)), 80);
        assert_eq!(c.window(), 10);
    }

    #[test]
    fn dctcp_takes_a_loss_as_damage_where_the_path_marks() {
        let mut c = Congestion::new(CcConfig::default(), 1);
        c.st.cwnd = 40.0;
        c.st.alpha = 0.0;
        let srtt = Some(Duration::from_millis(10));
        // alpha becomes 1/16: a reduction by 1/32.
        c.on_ack(ms(100), 5, 5, true, true, 41);
        assert_eq!(c.window(), 38);
        c.on_loss(ms(120), 45, srtt, 60);
        assert_eq!(c.window(), 38);
        assert_eq!(c.st.losses_ignored, 1);
        // Long after the last mark, a loss is congestion again.
        c.on_loss(ms(1000), 70, srtt, 90);
        assert_eq!(c.window(), 19);
        c.on_timeout(ms(2000), srtt, 100);
        assert_eq!(c.window(), 2);
    }

    #[test]
    fn a_loss_without_queueing_delay_is_taken_as_damage() {
        let mut c = Congestion::new(CcConfig::default(), 1);
        c.st.cwnd = 40.0;
        c.on_rtt_sample(Duration::from_millis(10));
        c.on_loss(ms(100), 5, Some(Duration::from_millis(10)), 41);
        c.on_timeout(ms(200), Some(Duration::from_millis(10)), 41);
        assert_eq!((c.window(), c.st.losses_ignored), (40, 2));
        // A queue that does not mark: the same loss is congestion.
        c.on_loss(ms(300), 50, Some(Duration::from_millis(20)), 61);
        assert_eq!(c.window(), 20);
        // AIMD halves in any case.
        let mut c = Congestion::new(CcConfig::aimd(), 1);
        c.st.cwnd = 40.0;
        c.on_rtt_sample(Duration::from_millis(10));
        c.on_loss(ms(100), 5, Some(Duration::from_millis(10)), 41);
        assert_eq!(c.window(), 20);
    }
}
