//! What every shim DIF refuses of a QoS spec: shims have no QoS cubes, do
//! not retransmit, and carry SDUs up to their own maximum. One check for
//! `shim_udp`, `shim_eth` and `shim_hv`, each naming itself in the reason.

use rina_wire::QosSpec;

/// What a shim offers, to check a spec against.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ShimQos<'a> {
    /// How the shim is named in reasons ("over UDP", "for hypervisors").
    pub what: &'a str,
    /// Largest SDU.
    pub max_sdu: u32,
    /// Said after the maximum SDU in a refusal ("" or " (…)").
    pub max_sdu_note: &'a str,
    /// Whether SDUs arrive in the order they were sent.
    pub in_order: bool,
    /// Said after "does not retransmit" ("" or " (…)").
    pub loss_note: &'a str,
}

impl ShimQos<'_> {
    /// Why the shim cannot serve `qos`, if it cannot.
    pub(crate) fn refusal(&self, qos: &QosSpec) -> Option<String> {
        let what = self.what;
        if let Some(c) = qos.cube {
            return Some(format!(
                "the shim DIF {what} has no QoS cubes (asked for cube {c}); ask a normal DIF"
            ));
        }
        if qos.reliable || qos.max_loss_ppm == Some(0) || qos.max_sdu_gap == Some(0) {
            return Some(format!(
                "the shim DIF {what} does not retransmit{}; ask for a normal DIF",
                self.loss_note
            ));
        }
        if qos.in_order && !self.in_order {
            return Some(format!(
                "the shim DIF {what} does not guarantee in-order delivery"
            ));
        }
        match qos.max_sdu_size {
            Some(s) if s > self.max_sdu => Some(format!(
                "SDUs of {s} bytes exceed the DIF's maximum of {}{}",
                self.max_sdu, self.max_sdu_note
            )),
            _ => None,
        }
    }
}
