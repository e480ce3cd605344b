//! CDAP writes between neighbours: the transport that link-state routing
//! ([`super::routing_glue`]) and the disseminated directory
//! ([`super::directory_glue`]) share. An object travels as an unconfirmed
//! `M_WRITE` whose value is the object's encoded bytes, in a management PDU
//! whose payload starts with [`CDAP_DISCRIMINATOR`].

use super::{N1Port, NormalIpcp};
use crate::time::Instant;
use rina_wire::cdap::{CdapMessage, OpCode, Value};

/// First byte of a management payload that holds one encoded CDAP message
/// (flow objects, routing, the directory, RIB reads).
pub const CDAP_DISCRIMINATOR: u8 = rina_wire::fa::CDAP_MGMT_DISCRIMINATOR;

/// A management payload: [`CDAP_DISCRIMINATOR`], then an unconfirmed CDAP
/// `M_WRITE` of `value` on object `name` of class `class`.
pub fn write_payload(class: &str, name: &str, value: Vec<u8>) -> Vec<u8> {
    let msg = CdapMessage::write(class, name, value);
    let mut out = vec![CDAP_DISCRIMINATOR];
    out.extend_from_slice(&msg.encode());
    out
}

/// Whether `msg` writes (or creates) object `name`.
pub(super) fn writes(msg: &CdapMessage, name: &str) -> bool {
    matches!(msg.op_code(), OpCode::Write | OpCode::Create) && msg.obj_name.as_deref() == Some(name)
}

impl NormalIpcp {
    /// The object a neighbour wrote, decoded by `decode`, with the port it
    /// came on; `None` (counted as malformed) when the value is not bytes,
    /// does not decode, or came through the loopback rather than a port.
    pub(super) fn written_object<T, E>(
        &mut self,
        port: Option<N1Port>,
        msg: &CdapMessage,
        decode: impl FnOnce(&[u8]) -> Result<T, E>,
    ) -> Option<(T, N1Port)> {
        let decoded = match msg.value() {
            Some(Value::Bytes(b)) => decode(&b).ok(),
            _ => None,
        };
        match (decoded, port) {
            (Some(obj), Some(port)) => Some((obj, port)),
            _ => {
                self.counters.rx_mgmt_malformed += 1;
                None
            }
        }
    }

    /// Sends each payload on its ports, to the neighbour recorded there.
    pub(super) fn send_to_neighbors(&mut self, now: Instant, out: Vec<(Vec<N1Port>, Vec<u8>)>) {
        for (ports, payload) in out {
            for port in ports {
                let dst = self.neighbors.get(&port).map_or(0, |n| n.0);
                self.send_management(now, port, dst, &payload);
            }
        }
    }
}
