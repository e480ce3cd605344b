//! The PDU forwarding table: (destination address, QoS-id) -> N-1 ports.

use super::{Address, PortId, QosId};
use crate::ids::IdMap;

/// Routes of an IPC process. An entry for a specific QoS-id wins over the
/// entry for any QoS-id (`None`); several ports in one entry are equal-cost
/// alternatives, chosen by a flow hash so a flow keeps to one path.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ForwardingTable {
    /// Hashed, as every PDU sent looks its destination up here; listed in
    /// order by [`ForwardingTable::entries`].
    entries: IdMap<(Address, Option<QosId>), Vec<PortId>>,
    /// Entries for one QoS-id: while there are none, a lookup asks only
    /// for the entry of any QoS-id.
    per_qos: usize,
}

impl ForwardingTable {
    /// Sets the ports for `dst` (and `qos_id`, or any QoS-id with `None`).
    /// An empty list removes the entry.
    pub fn set(&mut self, dst: Address, qos_id: Option<QosId>, ports: Vec<PortId>) {
        let had = if ports.is_empty() {
            self.entries.remove(&(dst, qos_id)).is_some()
        } else {
            self.entries.insert((dst, qos_id), ports).is_some()
        };
        let has = self.entries.contains_key(&(dst, qos_id));
        if qos_id.is_some() {
            self.per_qos = self.per_qos + usize::from(has) - usize::from(had);
        }
    }

    fn count_per_qos(&mut self) {
        self.per_qos = self.entries.keys().filter(|(_, q)| q.is_some()).count();
    }

    /// Removes every entry.
    pub fn clear(&mut self) {
        self.entries.clear();
        self.per_qos = 0;
    }

    /// Removes `port` from every entry (the N-1 flow is gone).
    pub fn remove_port(&mut self, port: PortId) {
        self.entries.retain(|_, ports| {
            ports.retain(|&p| p != port);
            !ports.is_empty()
        });
        self.count_per_qos();
    }

    /// The port to use for `dst` and `qos_id`.
    pub fn lookup(&self, dst: Address, qos_id: QosId, flow_hash: u64) -> Option<PortId> {
        let specific = if self.per_qos > 0 {
            self.entries.get(&(dst, Some(qos_id)))
        } else {
            None
        };
        let ports = specific.or_else(|| self.entries.get(&(dst, None)))?;
        let i = (flow_hash % ports.len() as u64) as usize;
        ports.get(i).copied()
    }

    /// All entries, in order.
    pub fn entries(&self) -> impl Iterator<Item = (Address, Option<QosId>, &[PortId])> {
        let mut all: Vec<_> = self
            .entries
            .iter()
            .map(|((a, q), p)| (*a, *q, p.as_slice()))
            .collect();
        all.sort_unstable_by_key(|&(a, q, _)| (a, q));
        all.into_iter()
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
