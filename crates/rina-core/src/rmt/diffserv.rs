//! A DiffServ-like policy (seed 004 Table 4, "DS"): a token-bucket policer
//! per cherish class drops the PDUs beyond the class's rate; what passes
//! waits in one FIFO per port, with no urgency differentiation (seed 004
//! reports DS as "a best-effort scenario" for delay). Management PDUs are
//! served first.

use super::config::{CuMap, DiffServConfig};
use super::tally::{MgmtQueue, Tally};
use super::token_bucket::TokenBucket;
use super::{PortId, QueueStats, QueuedPdu, Scheduler};
use crate::ids::IdMap;
use crate::time::Instant;
use std::collections::VecDeque;

#[derive(Debug, Clone)]
struct Port {
    mgmt: MgmtQueue,
    /// (class, PDU) in arrival order.
    fifo: VecDeque<(usize, QueuedPdu)>,
    buckets: Vec<Option<TokenBucket>>,
    class_tally: Vec<Tally>,
}

/// The DiffServ-like policy.
#[derive(Debug)]
pub struct DiffServ {
    cfg: DiffServConfig,
    cu: CuMap,
    template: Port,
    ports: IdMap<PortId, Port>,
}

impl DiffServ {
    /// The policy for cubes placed by `cu`; see
    /// [`super::SchedulerConfig::build`], which checks the parameters first
    /// (this assumes they are checked).
    pub(crate) fn new(cfg: DiffServConfig, cu: CuMap) -> Self {
        let template = Port {
            mgmt: MgmtQueue::new(cfg.mgmt_queue_len),
            fifo: VecDeque::new(),
            buckets: cfg
                .classes
                .iter()
                .map(|c| c.limit.map(TokenBucket::new))
                .collect(),
            class_tally: vec![Tally::default(); cfg.classes.len()],
        };
        DiffServ {
            cfg,
            cu,
            template,
            ports: IdMap::default(),
        }
    }
}

impl Scheduler for DiffServ {
    fn name(&self) -> &'static str {
        "diffserv"
    }

    fn create_queues(&mut self, port: PortId) {
        let t = &self.template;
        self.ports.entry(port).or_insert_with(|| t.clone());
    }

    fn destroy_queues(&mut self, port: PortId) -> usize {
        self.ports
            .remove(&port)
            .map_or(0, |p| p.fifo.len() + p.mgmt.len())
    }

    fn enqueue(&mut self, now: Instant, port: PortId, pdu: QueuedPdu) -> Result<(), QueuedPdu> {
        let class = usize::from(self.cu.cell(pdu.qos_id).cherish).min(self.cfg.classes.len() - 1);
        let Some(p) = self.ports.get_mut(&port) else {
            return Err(pdu);
        };
        if pdu.mgmt {
            return p.mgmt.push(pdu);
        }
        let conforms = match p.buckets[class].as_mut() {
            Some(b) => b.try_take(now, pdu.bytes.len()),
            None => true,
        };
        if !conforms || p.fifo.len() >= self.cfg.queue_len {
            p.class_tally[class].refuse();
            return Err(pdu);
        }
        p.fifo.push_back((class, pdu));
        p.class_tally[class].push();
        Ok(())
    }

    fn next_to_send(&mut self, _now: Instant, port: PortId) -> Option<QueuedPdu> {
        let p = self.ports.get_mut(&port)?;
        if let Some(m) = p.mgmt.pop() {
            return Some(m);
        }
        let (class, pdu) = p.fifo.pop_front()?;
        p.class_tally[class].pop();
        Some(pdu)
    }

    fn next_wakeup(&self, _port: PortId) -> Option<Instant> {
        None
    }

    fn data_backlog(&self, port: PortId, _qos_id: super::QosId) -> usize {
        self.ports.get(&port).map_or(0, |p| p.fifo.len())
    }

    fn has_queued(&self, port: PortId) -> bool {
        self.ports
            .get(&port)
            .is_some_and(|p| !p.fifo.is_empty() || p.mgmt.len() > 0)
    }

    fn stats(&self, port: PortId) -> Vec<QueueStats> {
        let Some(p) = self.ports.get(&port) else {
            return Vec::new();
        };
        let mut v = vec![p.mgmt.tally.stats("mgmt")];
        v.extend(
            p.class_tally
                .iter()
                .enumerate()
                .map(|(c, t)| t.stats(format!("cherish-{}", c + 1))),
        );
        v
    }
}
