//! QoS cubes: the classes of service a normal DIF offers, and how a QoS
//! spec is matched to one of them.

use super::{NormalConfig, NormalError};
use crate::efcp::EfcpConfig;
use rina_wire::QosSpec;

/// A class of service of the DIF: a QoS-id, a name, and the EFCP policies
/// every flow of the class uses (both ends use the same).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QosCube {
    /// QoS-id, carried in the PCI of every PDU of the class.
    pub id: u64,
    /// Name, for configuration and listings.
    pub name: String,
    /// EFCP policies of the class.
    pub efcp: EfcpConfig,
}

impl QosCube {
    /// A cube.
    pub fn new(id: u64, name: impl Into<String>, efcp: EfcpConfig) -> Self {
        QosCube {
            id,
            name: name.into(),
            efcp,
        }
    }

    /// The default cubes of a DIF: 1 "unreliable" and 2 "reliable".
    pub fn defaults() -> Vec<QosCube> {
        vec![
            QosCube::new(1, "unreliable", EfcpConfig::unreliable()),
            QosCube::new(2, "reliable", EfcpConfig::reliable()),
        ]
    }

    /// Whether the cube retransmits and delivers in order.
    pub fn is_reliable(&self) -> bool {
        self.efcp.rtx().is_some() && self.efcp.in_order
    }

    /// Whether the cube never gives up a lost PDU (so it loses nothing).
    pub fn is_lossless(&self) -> bool {
        self.is_reliable() && self.efcp.max_sdu_gap == Some(0)
    }
}

/// Whether `qos` asks for retransmission and in-order delivery.
fn wants_reliable(qos: &QosSpec) -> bool {
    qos.reliable || wants_lossless(qos) || qos.in_order
}

/// Whether `qos` asks that nothing be lost.
fn wants_lossless(qos: &QosSpec) -> bool {
    qos.reliable || qos.max_loss_ppm == Some(0) || qos.max_sdu_gap == Some(0)
}

/// The cube that serves `qos` among `cubes` of a DIF configured by `cfg`.
///
/// * A spec asking for reliability (`reliable`, `max_loss_ppm = 0`,
///   `max_sdu_gap = 0`) gets the first cube that retransmits, delivers in
///   order and never gives up a hole; `in_order` alone gets the first cube
///   that retransmits and delivers in order.
/// * Anything else gets the first cube without retransmission, or the first
///   cube at all if every cube retransmits.
/// * `max_sdu_size` above the DIF's maximum SDU cannot be served.
///
/// Delay, bandwidth and loss figures other than zero are not matched yet:
/// cubes do not declare them.
pub(crate) fn choose<'a>(
    cfg: &NormalConfig,
    cubes: &'a [QosCube],
    qos: &QosSpec,
) -> Result<&'a QosCube, NormalError> {
    if let Some(s) = qos.max_sdu_size {
        if s as usize > cfg.max_sdu {
            return Err(NormalError::QosNotSatisfiable(format!(
                "SDUs of {s} bytes exceed the maximum of {} bytes of DIF {}",
                cfg.max_sdu, cfg.dif
            )));
        }
    }
    let names = || {
        cubes
            .iter()
            .map(|c| format!("{} ({})", c.id, c.name))
            .collect::<Vec<_>>()
            .join(", ")
    };
    if wants_reliable(qos) {
        let lossless = wants_lossless(qos);
        return cubes
            .iter()
            .find(|c| {
                if lossless {
                    c.is_lossless()
                } else {
                    c.is_reliable()
                }
            })
            .ok_or_else(|| {
                NormalError::QosNotSatisfiable(format!(
                    "DIF {} has no QoS cube that retransmits{} (cubes: {})",
                    cfg.dif,
                    if lossless {
                        ", delivers in order and loses nothing"
                    } else {
                        " and delivers in order"
                    },
                    names()
                ))
            });
    }
    cubes
        .iter()
        .find(|c| c.efcp.rtx().is_none())
        .or_else(|| cubes.first())
        .ok_or_else(|| NormalError::QosNotSatisfiable(format!("DIF {} has no QoS cubes", cfg.dif)))
}
