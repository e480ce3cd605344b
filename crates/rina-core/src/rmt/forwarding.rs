//! The PDU forwarding table: (destination address, QoS-id) -> N-1 ports.

use super::{Address, PortId, QosId};
use std::collections::BTreeMap;

/// Routes of an IPC process. An entry for a specific QoS-id wins over the
/// entry for any QoS-id (`None`); several ports in one entry are equal-cost
/// alternatives, chosen by a flow hash so a flow keeps to one path.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ForwardingTable {
    entries: BTreeMap<(Address, Option<QosId>), Vec<PortId>>,
}

impl ForwardingTable {
    /// Sets the ports for `dst` (and `qos_id`, or any QoS-id with `None`).
    /// An empty list removes the entry.
    pub fn set(&mut self, dst: Address, qos_id: Option<QosId>, ports: Vec<PortId>) {
        if ports.is_empty() {
            self.entries.remove(&(dst, qos_id));
        } else {
            self.entries.insert((dst, qos_id), ports);
        }
    }

    /// Removes every entry.
    pub fn clear(&mut self) {
        self.entries.clear();
    }

    /// Removes `port` from every entry (the N-1 flow is gone).
    pub fn remove_port(&mut self, port: PortId) {
        self.entries.retain(|_, ports| {
            ports.retain(|&p| p != port);
            !ports.is_empty()
        });
    }

    /// The port to use for `dst` and `qos_id`.
    pub fn lookup(&self, dst: Address, qos_id: QosId, flow_hash: u64) -> Option<PortId> {
        let ports = self
            .entries
            .get(&(dst, Some(qos_id)))
            .or_else(|| self.entries.get(&(dst, None)))?;
        let i = (flow_hash % ports.len() as u64) as usize;
        ports.get(i).copied()
    }

    /// All entries, in order.
    pub fn entries(&self) -> impl Iterator<Item = (Address, Option<QosId>, &[PortId])> {
        self.entries
            .iter()
            .map(|((a, q), p)| (*a, *q, p.as_slice()))
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}
