//! Flow-state objects to and from IRATI's `flowStateObject_t` payload.

use super::{Fso, RoutingError};
use rina_wire::cdap::{decode_object, encode_object, FlowStateObject, FlowStateObjectGroup};

/// RIB name of the container of all flow-state objects; updates are CDAP
/// `M_WRITE` (or `M_CREATE`) on this name with a [`FlowStateObjectGroup`].
pub const FSOS_OBJ_NAME: &str = "/ra/fsos";
/// RIB class of the container [`FSOS_OBJ_NAME`].
pub const FSOS_OBJ_CLASS: &str = "FlowStateObjects";
/// RIB class of one flow-state object (`/ra/fsos/key=<origin>-<neighbour>`).
pub const FSO_OBJ_CLASS: &str = "FlowStateObject";

/// One FSO as IRATI's `flowStateObject_t`.
///
/// This machine knows addresses, not IPCP names: `name` and `neighbor_name`
/// are written as the decimal addresses (IRATI keys FSOs by
/// `"<name>-<neighbor_name>"`, which stays unique that way), and the address
/// lists hold exactly one address each.
pub fn fso_to_wire(fso: &Fso) -> FlowStateObject {
    FlowStateObject {
        name: fso.origin.to_string(),
        addresses: vec![fso.origin],
        neighbor_name: fso.neighbor.to_string(),
        neighbor_addresses: vec![fso.neighbor],
        cost: fso.cost,
        sequence_number: fso.seq,
        state: fso.up,
        age: fso.age,
    }
}

/// One FSO from IRATI's `flowStateObject_t`: the first address of each list
/// is used, the names are ignored.
pub fn fso_from_wire(w: &FlowStateObject) -> Result<Fso, RoutingError> {
    let origin = *w.addresses.first().ok_or(RoutingError::NoOriginAddress)?;
    let neighbor = *w
        .neighbor_addresses
        .first()
        .ok_or(RoutingError::NoNeighborAddress)?;
    Ok(Fso {
        origin,
        neighbor,
        cost: w.cost,
        seq: w.sequence_number,
        up: w.state,
        age: w.age,
    })
}

/// A batch of FSOs as a `flowStateObjectGroup_t`.
pub fn fsos_to_wire(fsos: &[Fso]) -> FlowStateObjectGroup {
    FlowStateObjectGroup {
        flow_state_objects: fsos.iter().map(fso_to_wire).collect(),
    }
}

/// A batch of FSOs from a `flowStateObjectGroup_t`; fails on the first
/// object without addresses.
pub fn fsos_from_wire(g: &FlowStateObjectGroup) -> Result<Vec<Fso>, RoutingError> {
    g.flow_state_objects.iter().map(fso_from_wire).collect()
}

/// A batch of FSOs encoded as the CDAP object value (`objValue.byteval`).
pub fn encode_fsos(fsos: &[Fso]) -> Vec<u8> {
    encode_object(&fsos_to_wire(fsos))
}

/// A batch of FSOs decoded from a CDAP object value. Never panics.
pub fn decode_fsos(bytes: &[u8]) -> Result<Vec<Fso>, RoutingError> {
    let g: FlowStateObjectGroup =
        decode_object(bytes).map_err(|e| RoutingError::Malformed(e.to_string()))?;
    fsos_from_wire(&g)
}
