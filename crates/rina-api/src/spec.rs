//! `struct rina_flow_spec` and its mapping to the daemon's [`QosSpec`].

use rina_wire::qos::MAX_SDU_GAP;
use rina_wire::QosSpec;

/// The version of `struct rina_flow_spec` this library understands.
pub const RINA_FLOW_SPEC_VERSION: u32 = 2;
/// `max_loss` meaning 100 % (any loss is fine).
pub const RINA_FLOW_SPEC_LOSS_MAX: u16 = 10000;

/// `struct rina_flow_spec`, laid out as in rlite's `rina/api.h` (version 2).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RinaFlowSpec {
    /// Must be [`RINA_FLOW_SPEC_VERSION`].
    pub version: u32,
    /// Largest delay, in microseconds (0: no bound).
    pub max_delay: u32,
    /// Largest run of lost SDUs (0: none may be lost, a reliable flow;
    /// `u64::MAX`: no bound; otherwise at most [`MAX_SDU_GAP`]).
    pub max_sdu_gap: u64,
    /// Average bandwidth, in bits per second (0: no bound).
    pub avg_bandwidth: u64,
    /// Largest loss, 0 (0 %) to [`RINA_FLOW_SPEC_LOSS_MAX`] (100 %).
    pub max_loss: u16,
    /// SDUs delivered in order (boolean).
    pub in_order_delivery: u8,
    /// SDU boundaries kept (boolean; flows always keep them).
    pub msg_boundaries: u8,
    /// Largest jitter, in microseconds (0: no bound; not used by the DIFs).
    pub max_jitter: u32,
}

impl RinaFlowSpec {
    /// The best-effort spec: unreliable, no bounds, boundaries kept.
    pub fn unreliable() -> Self {
        RinaFlowSpec {
            version: RINA_FLOW_SPEC_VERSION,
            max_delay: 0,
            max_sdu_gap: u64::MAX,
            avg_bandwidth: 0,
            max_loss: RINA_FLOW_SPEC_LOSS_MAX,
            in_order_delivery: 0,
            msg_boundaries: 1,
            max_jitter: 0,
        }
    }

    /// The daemon's spec for this one; `Err` says what is wrong.
    pub fn to_qos(&self) -> Result<QosSpec, String> {
        if self.version != RINA_FLOW_SPEC_VERSION {
            return Err(format!(
                "struct rina_flow_spec version {} is not supported (this library knows version {RINA_FLOW_SPEC_VERSION}; fill it with rina_flow_spec_unreliable())",
                self.version
            ));
        }
        if self.max_loss > RINA_FLOW_SPEC_LOSS_MAX {
            return Err(format!(
                "max_loss {} is above {RINA_FLOW_SPEC_LOSS_MAX} (100 %)",
                self.max_loss
            ));
        }
        let gap = (self.max_sdu_gap != u64::MAX).then_some(self.max_sdu_gap);
        let max_sdu_gap = match gap.map(u32::try_from) {
            None => None,
            Some(Ok(g)) if g <= MAX_SDU_GAP => Some(g),
            Some(_) => {
                return Err(format!(
                    "max_sdu_gap {} is above {MAX_SDU_GAP}, the largest gap a flow can ask for (UINT64_MAX: any gap)",
                    self.max_sdu_gap
                ))
            }
        };
        let reliable = self.max_sdu_gap == 0;
        Ok(QosSpec {
            max_delay_us: (self.max_delay > 0).then_some(u64::from(self.max_delay)),
            max_loss_ppm: (self.max_loss < RINA_FLOW_SPEC_LOSS_MAX)
                .then_some(u32::from(self.max_loss) * 100),
            avg_bandwidth_bps: (self.avg_bandwidth > 0).then_some(self.avg_bandwidth),
            // A reliable flow is delivered in order too.
            in_order: self.in_order_delivery != 0 || reliable,
            reliable,
            max_sdu_gap,
            max_sdu_size: None,
            cube: None,
        })
    }

    /// The C spec describing what a peer asked for.
    pub fn from_qos(q: &QosSpec) -> Self {
        let gap = match (q.reliable, q.max_sdu_gap) {
            (true, _) => 0,
            (false, Some(g)) => u64::from(g),
            (false, None) => u64::MAX,
        };
        RinaFlowSpec {
            version: RINA_FLOW_SPEC_VERSION,
            max_delay: q
                .max_delay_us
                .map_or(0, |d| u32::try_from(d).unwrap_or(u32::MAX)),
            max_sdu_gap: gap,
            avg_bandwidth: q.avg_bandwidth_bps.unwrap_or(0),
            max_loss: q.max_loss_ppm.map_or(RINA_FLOW_SPEC_LOSS_MAX, |p| {
                u16::try_from(p / 100)
                    .unwrap_or(RINA_FLOW_SPEC_LOSS_MAX)
                    .min(RINA_FLOW_SPEC_LOSS_MAX)
            }),
            in_order_delivery: u8::from(q.in_order),
            msg_boundaries: 1,
            max_jitter: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_matches_rlite() {
        assert_eq!(std::mem::size_of::<RinaFlowSpec>(), 32);
        assert_eq!(std::mem::offset_of!(RinaFlowSpec, max_sdu_gap), 8);
        assert_eq!(std::mem::offset_of!(RinaFlowSpec, max_loss), 24);
        assert_eq!(std::mem::offset_of!(RinaFlowSpec, max_jitter), 28);
    }

    #[test]
    fn unreliable_is_best_effort() {
        assert_eq!(
            RinaFlowSpec::unreliable().to_qos().unwrap(),
            QosSpec::default()
        );
    }

    #[test]
    fn gap_zero_is_reliable_and_bounds_map_over() {
        let mut s = RinaFlowSpec::unreliable();
        s.max_sdu_gap = 0;
        s.max_delay = 5000;
        s.max_loss = 100;
        s.avg_bandwidth = 2_000_000;
        let q = s.to_qos().unwrap();
        assert!(q.reliable && q.in_order);
        assert_eq!(q.max_delay_us, Some(5000));
        assert_eq!(q.max_loss_ppm, Some(10_000));
        assert_eq!(q.avg_bandwidth_bps, Some(2_000_000));
        let back = RinaFlowSpec::from_qos(&q);
        assert_eq!(
            (back.max_sdu_gap, back.max_delay, back.max_loss),
            (0, 5000, 100)
        );
        assert_eq!(back.in_order_delivery, 1);
    }

    #[test]
    fn bad_specs_are_refused() {
        let mut s = RinaFlowSpec::unreliable();
        s.version = 1;
        assert!(s.to_qos().is_err());
        let mut s = RinaFlowSpec::unreliable();
        s.max_loss = 10001;
        assert!(s.to_qos().is_err());
    }

    #[test]
    fn a_gap_a_flow_cannot_carry_is_refused_not_cut() {
        let mut s = RinaFlowSpec::unreliable();
        s.max_sdu_gap = u64::from(MAX_SDU_GAP);
        assert_eq!(s.to_qos().unwrap().max_sdu_gap, Some(MAX_SDU_GAP));
        for g in [u64::from(MAX_SDU_GAP) + 1, u64::from(u32::MAX), 1 << 40] {
            s.max_sdu_gap = g;
            let e = s.to_qos().unwrap_err();
            assert!(e.contains(&format!("max_sdu_gap {g} is above")), "{e}");
        }
    }
}
