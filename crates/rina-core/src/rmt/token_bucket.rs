//! Token buckets: the policer/shaper of a QoS cube in QTA-Mux and of a
//! cherish class in the DiffServ-like policy, and the `token-bucket` policy
//! (one bucket per port in front of a FIFO).
//!
//! Tokens are counted in nano-bits (10⁻⁹ bit), so a bucket of rate `r`
//! bit/s gains exactly `r` nano-bits per nanosecond: no rounding, whatever
//! the rate. A bucket starts full at its first use.

use super::config::{BucketParams, Excess, TokenBucketConfig};
use super::tally::{MgmtQueue, Tally};
use super::{PortId, QueueStats, QueuedPdu, Scheduler};
use crate::ids::IdMap;
use crate::time::Instant;
use std::collections::VecDeque;
use std::time::Duration;

const NANOBITS_PER_BIT: u128 = 1_000_000_000;

/// Nano-bits a PDU of `bytes` costs.
fn cost(bytes: usize) -> u128 {
    (bytes as u128) * 8 * NANOBITS_PER_BIT
}

/// A token bucket of rate `rate_bps` and depth `burst_bytes`.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    params: BucketParams,
    tokens: u128,
    last: Option<Instant>,
}

impl TokenBucket {
    /// A full bucket.
    pub fn new(params: BucketParams) -> Self {
        TokenBucket {
            params,
            tokens: (params.burst_bytes as u128) * 8 * NANOBITS_PER_BIT,
            last: None,
        }
    }

    fn cap(&self) -> u128 {
        (self.params.burst_bytes as u128) * 8 * NANOBITS_PER_BIT
    }

    /// Adds the tokens earned since the last call.
    pub fn refill(&mut self, now: Instant) {
        let Some(last) = self.last else {
            self.last = Some(now);
            return;
        };
        if now <= last {
            return;
        }
        let dt = u128::from((now - last).as_nanos() as u64);
        let gain = dt.saturating_mul(u128::from(self.params.rate_bps));
        self.tokens = self.tokens.saturating_add(gain).min(self.cap());
        self.last = Some(now);
    }

    /// Tokens now, in whole bits.
    pub fn tokens_bits(&self) -> u64 {
        (self.tokens / NANOBITS_PER_BIT) as u64
    }

    /// Whether a PDU of `bytes` could ever pass (it fits in the bucket).
    pub fn fits(&self, bytes: usize) -> bool {
        cost(bytes) <= self.cap()
    }

    /// Takes the tokens of a PDU of `bytes` if there are enough.
    pub fn try_take(&mut self, now: Instant, bytes: usize) -> bool {
        self.refill(now);
        let c = cost(bytes);
        if c <= self.tokens {
            self.tokens -= c;
            true
        } else {
            false
        }
    }

    /// When the bucket will hold the tokens of a PDU of `bytes` (`None`:
    /// never, it does not fit). Call after [`TokenBucket::refill`].
    pub fn ready_at(&self, bytes: usize) -> Option<Instant> {
        if !self.fits(bytes) {
            return None;
        }
        let last = self.last.unwrap_or(Instant::ZERO);
        let need = cost(bytes).saturating_sub(self.tokens);
        let rate = u128::from(self.params.rate_bps.max(1));
        let ns = need.div_ceil(rate);
        Some(last + Duration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX)))
    }
}

#[derive(Debug)]
struct TbPort {
    bucket: TokenBucket,
    mgmt: MgmtQueue,
    data: VecDeque<QueuedPdu>,
    tally: Tally,
}

/// The `token-bucket` policy: per port, management PDUs first, then a FIFO
/// behind one token bucket. With [`Excess::Drop`] PDUs beyond the rate are
/// dropped on arrival (a policer); with [`Excess::Delay`] the head of the
/// FIFO waits for its tokens (a shaper).
#[derive(Debug)]
pub struct TokenBucketPolicy {
    cfg: TokenBucketConfig,
    ports: IdMap<PortId, TbPort>,
}

impl TokenBucketPolicy {
    /// The policy, built by [`super::SchedulerConfig::build`], which checks
    /// the parameters first.
    pub(crate) fn new(cfg: TokenBucketConfig) -> Self {
        TokenBucketPolicy {
            cfg,
            ports: IdMap::default(),
        }
    }
}

impl Scheduler for TokenBucketPolicy {
    fn name(&self) -> &'static str {
        "token-bucket"
    }

    fn create_queues(&mut self, port: PortId) {
        let params = BucketParams {
            rate_bps: self.cfg.rate_bps,
            burst_bytes: self.cfg.burst_bytes,
        };
        let mgmt_len = self.cfg.queue_len;
        self.ports.entry(port).or_insert_with(|| TbPort {
            bucket: TokenBucket::new(params),
            mgmt: MgmtQueue::new(mgmt_len),
            data: VecDeque::new(),
            tally: Tally::default(),
        });
    }

    fn destroy_queues(&mut self, port: PortId) -> usize {
        self.ports
            .remove(&port)
            .map_or(0, |p| p.data.len() + p.mgmt.len())
    }

    fn enqueue(&mut self, now: Instant, port: PortId, pdu: QueuedPdu) -> Result<(), QueuedPdu> {
        let Some(p) = self.ports.get_mut(&port) else {
            return Err(pdu);
        };
        if pdu.mgmt {
            return p.mgmt.push(pdu);
        }
        let len = pdu.bytes.len();
        let refused = p.data.len() >= self.cfg.queue_len
            || match self.cfg.excess {
                Excess::Drop => !p.bucket.try_take(now, len),
                Excess::Delay => !p.bucket.fits(len),
            };
        if refused {
            p.tally.refuse();
            return Err(pdu);
        }
        p.data.push_back(pdu);
        p.tally.push();
        Ok(())
    }

    fn next_to_send(&mut self, now: Instant, port: PortId) -> Option<QueuedPdu> {
        let p = self.ports.get_mut(&port)?;
        if let Some(m) = p.mgmt.pop() {
            return Some(m);
        }
        let len = p.data.front()?.bytes.len();
        if self.cfg.excess == Excess::Delay && !p.bucket.try_take(now, len) {
            return None;
        }
        p.tally.pop();
        p.data.pop_front()
    }

    fn next_wakeup(&self, port: PortId) -> Option<Instant> {
        let p = self.ports.get(&port)?;
        if self.cfg.excess == Excess::Drop || p.mgmt.len() > 0 {
            return None;
        }
        p.bucket.ready_at(p.data.front()?.bytes.len())
    }

    fn data_backlog(&self, port: PortId, _qos_id: super::QosId) -> usize {
        self.ports.get(&port).map_or(0, |p| p.data.len())
    }

    fn has_queued(&self, port: PortId) -> bool {
        self.ports
            .get(&port)
            .is_some_and(|p| !p.data.is_empty() || p.mgmt.len() > 0)
    }

    fn stats(&self, port: PortId) -> Vec<QueueStats> {
        self.ports
            .get(&port)
            .map(|p| vec![p.mgmt.tally.stats("mgmt"), p.tally.stats("bucket")])
            .unwrap_or_default()
    }
}
