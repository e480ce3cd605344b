//! FIFO scheduling: one bounded queue per port, management PDUs first.

use super::{PortId, QueueStats, QueuedPdu, Scheduler};
use crate::ids::IdMap;
use crate::time::Instant;
use std::collections::VecDeque;

/// Default queue bound, in PDUs.
pub const DEFAULT_FIFO_LEN: usize = 1000;

#[derive(Debug, Default)]
struct Queue {
    mgmt: VecDeque<QueuedPdu>,
    data: VecDeque<QueuedPdu>,
    sent: u64,
    dropped: u64,
    max_occupancy: usize,
}

impl Queue {
    fn len(&self) -> usize {
        self.mgmt.len() + self.data.len()
    }
}

/// First in, first out, with a bound per port (tail drop). Management PDUs
/// wait in a short queue of their own that is served first, so routing and
/// enrollment keep working when data congests a port.
#[derive(Debug)]
pub struct Fifo {
    cap: usize,
    queues: IdMap<PortId, Queue>,
}

impl Fifo {
    /// A FIFO holding at most `cap` PDUs per port.
    pub fn new(cap: usize) -> Self {
        Fifo {
            cap: cap.max(1),
            queues: IdMap::default(),
        }
    }
}

impl Default for Fifo {
    fn default() -> Self {
        Fifo::new(DEFAULT_FIFO_LEN)
    }
}

impl Scheduler for Fifo {
    fn name(&self) -> &'static str {
        "fifo"
    }

    fn create_queues(&mut self, port: PortId) {
        self.queues.entry(port).or_default();
    }

    fn destroy_queues(&mut self, port: PortId) -> usize {
        self.queues.remove(&port).map_or(0, |q| q.len())
    }

    fn enqueue(&mut self, _now: Instant, port: PortId, pdu: QueuedPdu) -> Result<(), QueuedPdu> {
        let Some(q) = self.queues.get_mut(&port) else {
            return Err(pdu);
        };
        if q.len() >= self.cap {
            q.dropped += 1;
            return Err(pdu);
        }
        if pdu.mgmt {
            q.mgmt.push_back(pdu);
        } else {
            q.data.push_back(pdu);
        }
        q.max_occupancy = q.max_occupancy.max(q.len());
        Ok(())
    }

    fn data_backlog(&self, port: PortId, _qos_id: super::QosId) -> usize {
        self.queues.get(&port).map_or(0, |q| q.data.len())
    }

    fn next_to_send(&mut self, _now: Instant, port: PortId) -> Option<QueuedPdu> {
        let q = self.queues.get_mut(&port)?;
        let pdu = q.mgmt.pop_front().or_else(|| q.data.pop_front())?;
        q.sent += 1;
        Some(pdu)
    }

    fn next_wakeup(&self, _port: PortId) -> Option<Instant> {
        None
    }

    fn pass(&mut self, _now: Instant, port: PortId, _pdu: &QueuedPdu) -> bool {
        let Some(q) = self.queues.get_mut(&port) else {
            return false;
        };
        if q.len() > 0 {
            return false;
        }
        // As if queued and taken at once: it was the queue's only PDU.
        q.sent += 1;
        q.max_occupancy = q.max_occupancy.max(1);
        true
    }

    fn has_queued(&self, port: PortId) -> bool {
        self.queues.get(&port).is_some_and(|q| q.len() > 0)
    }

    fn queued(&self, port: PortId) -> usize {
        self.queues.get(&port).map_or(0, |q| q.len())
    }

    fn stats(&self, port: PortId) -> Vec<QueueStats> {
        self.queues
            .get(&port)
            .map(|q| {
                vec![QueueStats {
                    queue: "fifo".into(),
                    queued: q.len(),
                    sent: q.sent,
                    dropped: q.dropped,
                    max_occupancy: q.max_occupancy,
                }]
            })
            .unwrap_or_default()
    }
}
