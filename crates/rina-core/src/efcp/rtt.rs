//! Round-trip time estimation and the retransmission timeout (RFC 6298).

use std::time::Duration;

/// Clock granularity G of RFC 6298 as the daemon's timers see it.
pub const CLOCK_GRANULARITY: Duration = Duration::from_millis(1);

/// SRTT/RTTVAR estimator with exponential back-off.
///
/// * First sample R: SRTT = R, RTTVAR = R/2.
/// * Later samples: RTTVAR = 3/4·RTTVAR + 1/4·|SRTT − R|, then
///   SRTT = 7/8·SRTT + 1/8·R (alpha 1/8, beta 1/4).
/// * RTO = SRTT + max(G, 4·RTTVAR), clamped to `[min_rto, max_rto]`.
/// * [`RttEstimator::backoff`] doubles the RTO (up to `max_rto`) after a
///   timeout; [`RttEstimator::reset_backoff`] undoes that when new data is
///   acknowledged. The caller applies Karn's rule: no samples from
///   retransmitted PDUs.
#[derive(Debug, Clone)]
pub struct RttEstimator {
    srtt: Option<Duration>,
    rttvar: Duration,
    base_rto: Duration,
    backoff: u32,
    min_rto: Duration,
    max_rto: Duration,
    granularity: Duration,
}

impl RttEstimator {
    /// An estimator with no samples yet.
    pub fn new(initial_rto: Duration, min_rto: Duration, max_rto: Duration) -> Self {
        RttEstimator {
            srtt: None,
            rttvar: Duration::ZERO,
            base_rto: initial_rto.clamp(min_rto, max_rto.max(min_rto)),
            backoff: 0,
            min_rto,
            max_rto: max_rto.max(min_rto),
            granularity: CLOCK_GRANULARITY,
        }
    }

    /// The same with another clock granularity G.
    pub fn with_granularity(mut self, g: Duration) -> Self {
        self.granularity = g;
        self
    }

    /// Feeds one RTT measurement.
    pub fn sample(&mut self, r: Duration) {
        match self.srtt {
            None => {
                self.srtt = Some(r);
                self.rttvar = r / 2;
            }
            Some(srtt) => {
                let diff = srtt.abs_diff(r);
                self.rttvar = self.rttvar * 3 / 4 + diff / 4;
                self.srtt = Some(srtt * 7 / 8 + r / 8);
            }
        }
        let srtt = self.srtt.unwrap_or(r);
        let rto = srtt.saturating_add(self.granularity.max(self.rttvar.saturating_mul(4)));
        self.base_rto = rto.clamp(self.min_rto, self.max_rto);
    }

    /// The current RTO, back-off included.
    pub fn rto(&self) -> Duration {
        let mut rto = self.base_rto;
        for _ in 0..self.backoff {
            rto = rto.saturating_mul(2);
            if rto >= self.max_rto {
                return self.max_rto;
            }
        }
        rto
    }

    /// Doubles the RTO after a retransmission timeout (up to `max_rto`).
    pub fn backoff(&mut self) {
        if self.rto() < self.max_rto {
            self.backoff += 1;
        }
    }

    /// Drops the back-off (new data was acknowledged).
    pub fn reset_backoff(&mut self) {
        self.backoff = 0;
    }

    /// Smoothed RTT, once there is a sample.
    pub fn srtt(&self) -> Option<Duration> {
        self.srtt
    }

    /// RTT variation.
    pub fn rttvar(&self) -> Duration {
        self.rttvar
    }
}
