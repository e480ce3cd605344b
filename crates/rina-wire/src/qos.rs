//! The QoS spec: what an application asks of a flow.
//!
//! Every field is optional; an empty spec asks for best effort. A DIF answers
//! a spec with one of its QoS cubes or refuses the allocation.

use crate::codec::{Reader, WireError};
use serde::{Deserialize, Serialize};

/// What an application requires of a flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct QosSpec {
    /// Largest acceptable one-way delay, in microseconds.
    pub max_delay_us: Option<u64>,
    /// Largest acceptable loss, in parts per million of SDUs.
    pub max_loss_ppm: Option<u32>,
    /// Average bandwidth the flow will use, in bits per second.
    pub avg_bandwidth_bps: Option<u64>,
    /// SDUs must be delivered in the order they were written.
    pub in_order: bool,
    /// Every SDU must be delivered (retransmission); implies `max_sdu_gap = 0`.
    pub reliable: bool,
    /// Largest number of consecutive SDUs that may be lost (for partial
    /// delivery); at most [`MAX_SDU_GAP`] for a flow of a normal DIF.
    pub max_sdu_gap: Option<u32>,
    /// Largest SDU the application will write, in bytes.
    pub max_sdu_size: Option<u32>,
    /// A QoS cube of the DIF asked for by its QoS-id (`rinactl rib <ipcp>
    /// /ra/qoscubes` lists them), instead of letting the DIF choose one that
    /// serves the rest of the spec. Only the control protocol carries it:
    /// the DIF's own messages carry the QoS-id it chose, and the shim DIFs,
    /// which have no cubes, refuse it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cube: Option<u64>,
}

/// Largest [`QosSpec::max_sdu_gap`] a flow of a normal DIF can ask for:
/// its flow request carries the gap as a signed 32-bit number (IRATI's
/// `maxAllowableGapSdu`, where a negative gap means any gap).
pub const MAX_SDU_GAP: u32 = i32::MAX as u32;

/// Encoded size of a [`QosSpec`]: flags byte, then four fixed fields.
pub const QOS_WIRE_LEN: usize = 1 + 8 + 4 + 8 + 4 + 4;

const F_IN_ORDER: u8 = 1 << 0;
const F_RELIABLE: u8 = 1 << 1;
const F_DELAY: u8 = 1 << 2;
const F_LOSS: u8 = 1 << 3;
const F_BW: u8 = 1 << 4;
const F_GAP: u8 = 1 << 5;
const F_SDU: u8 = 1 << 6;

impl QosSpec {
    /// Best effort: no requirement at all.
    pub fn best_effort() -> Self {
        Self::default()
    }

    /// Appends the fixed-size binary form ([`QOS_WIRE_LEN`] bytes).
    pub fn encode(&self, out: &mut Vec<u8>) {
        let mut flags = 0u8;
        let mut set = |cond: bool, f: u8| {
            if cond {
                flags |= f
            }
        };
        set(self.in_order, F_IN_ORDER);
        set(self.reliable, F_RELIABLE);
        set(self.max_delay_us.is_some(), F_DELAY);
        set(self.max_loss_ppm.is_some(), F_LOSS);
        set(self.avg_bandwidth_bps.is_some(), F_BW);
        set(self.max_sdu_gap.is_some(), F_GAP);
        set(self.max_sdu_size.is_some(), F_SDU);
        out.push(flags);
        out.extend_from_slice(&self.max_delay_us.unwrap_or(0).to_be_bytes());
        out.extend_from_slice(&self.max_loss_ppm.unwrap_or(0).to_be_bytes());
        out.extend_from_slice(&self.avg_bandwidth_bps.unwrap_or(0).to_be_bytes());
        out.extend_from_slice(&self.max_sdu_gap.unwrap_or(0).to_be_bytes());
        out.extend_from_slice(&self.max_sdu_size.unwrap_or(0).to_be_bytes());
    }

    /// Reads the binary form written by [`QosSpec::encode`].
    pub fn decode(r: &mut Reader<'_>) -> Result<Self, WireError> {
        let flags = r.u8()?;
        if flags & 0x80 != 0 {
            return Err(WireError::BadValue {
                field: "qos.flags",
                value: flags as u64,
            });
        }
        let delay = r.u64()?;
        let loss = r.u32()?;
        let bw = r.u64()?;
        let gap = r.u32()?;
        let sdu = r.u32()?;
        let opt = |f: u8| flags & f != 0;
        Ok(QosSpec {
            in_order: opt(F_IN_ORDER),
            reliable: opt(F_RELIABLE),
            max_delay_us: opt(F_DELAY).then_some(delay),
            max_loss_ppm: opt(F_LOSS).then_some(loss),
            avg_bandwidth_bps: opt(F_BW).then_some(bw),
            max_sdu_gap: opt(F_GAP).then_some(gap),
            max_sdu_size: opt(F_SDU).then_some(sdu),
            cube: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn round_trip(
            d in proptest::option::of(any::<u64>()), l in proptest::option::of(any::<u32>()),
            b in proptest::option::of(any::<u64>()), io in any::<bool>(), rel in any::<bool>(),
            g in proptest::option::of(any::<u32>()), s in proptest::option::of(any::<u32>()),
        ) {
            let q = QosSpec { max_delay_us: d, max_loss_ppm: l, avg_bandwidth_bps: b,
                in_order: io, reliable: rel, max_sdu_gap: g, max_sdu_size: s, cube: None };
            let mut v = Vec::new();
            q.encode(&mut v);
            prop_assert_eq!(v.len(), QOS_WIRE_LEN);
            let mut r = Reader::new(&v);
            prop_assert_eq!(QosSpec::decode(&mut r).unwrap(), q);
            prop_assert_eq!(r.remaining(), 0);
        }
    }
}
