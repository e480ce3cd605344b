//! Application flows of normal IPCPs: SDUs read from the application's
//! socket (or ring) go to the system whole; an SDU the flow cannot take
//! yet (its window is closed, or the RMT below is full) waits in the
//! daemon, and the application's writes block, until the system says the
//! flow is writable (or, once the application has closed the flow, until
//! the system gives up on it: [`rina_core::system::System::app_closed`]).
//! The N-1 flows, the resource allocator and the cube
//! lanes live in the core ([`rina_core::system`]).

use super::*;
use rina_core::system::{FlowError, SduSource};

/// What the daemon keeps of a normal IPCP besides its machine.
pub(super) struct NormalIo {
    /// The RMT scheduling policy in use, as configured (`rinactl sched`).
    pub sched: rina_core::rmt::SchedulerConfig,
}

/// What became of an SDU handed to the system.
enum Took {
    /// Taken, or dropped and counted.
    Yes,
    /// Kept for later: reading stops until the flow is writable.
    Stashed,
}

impl Daemon {
    /// Hands SDU `sdu` the application wrote on flow `port` to the system,
    /// held until the caller settles the batch.
    fn write_sdu(&mut self, now: Instant, port: PortId, len: usize) -> Took {
        match self.sys.write_held(now, port, &self.buf[..len]) {
            Ok(()) => Took::Yes,
            Err(FlowError::WouldBlock) => {
                if let Some(s) = self.flows.get_mut(&port) {
                    s.tx_stash = Some(self.buf[..len].to_vec());
                }
                Took::Stashed
            }
            Err(e) => {
                if let Some(s) = self.flows.get_mut(&port) {
                    s.drops_out += 1;
                }
                debug!(port, error = %e, "SDU not sent");
                Took::Yes
            }
        }
    }

    /// Reads SDUs the application wrote on normal flow `port` and sends
    /// them: the system takes the turn's SDUs one by one and then carries
    /// out once what they set off (their PDUs through the IPCPs below).
    pub(super) fn service_normal_flow(&mut self, port: PortId) -> FlowService {
        let now = self.now();
        let Some(slot) = self.flows.get(&port) else {
            return FlowService::Drained;
        };
        let served = if slot.rings.is_some() {
            self.service_normal_rings(now, port)
        } else if slot.tx_stash.is_some() {
            // Reading waits for the flow to be writable, but a close must
            // be seen now: its event comes once, and the window may never
            // open. The SDUs still in the socket may go in the time the
            // system gives them.
            if slot.app_gone() {
                self.sys.app_closed(now, port);
            }
            return FlowService::Drained;
        } else {
            self.service_normal_socket(now, port)
        };
        self.sys.settle(now);
        served
    }

    /// Takes up to [`BUDGET`] SDUs (and [`BUDGET_BYTES`]) from the socket of
    /// normal flow `port` into the system, held.
    fn service_normal_socket(&mut self, now: Instant, port: PortId) -> FlowService {
        let Some(slot) = self.flows.get(&port) else {
            return FlowService::Drained;
        };
        let Some(fd) = slot.sock() else {
            return FlowService::Drained;
        };
        let mut bytes = 0;
        for _ in 0..BUDGET {
            if bytes >= BUDGET_BYTES {
                break;
            }
            let len = match sys::recv(fd, &mut self.buf) {
                Ok(Recv::Packet(len)) if len <= self.buf.len() => len,
                Ok(Recv::Packet(_)) | Ok(Recv::Empty) => {
                    if let Some(s) = self.flows.get_mut(&port) {
                        s.drops_out += 1;
                    }
                    continue;
                }
                Ok(Recv::WouldBlock) => return FlowService::Drained,
                Ok(Recv::Closed) | Err(_) => return FlowService::Closed,
            };
            bytes += len;
            if let Took::Stashed = self.write_sdu(now, port, len) {
                return FlowService::Drained;
            }
        }
        FlowService::More
    }

    /// Hands SDUs held for the application of ring flow `port` to its
    /// ring; true if room appeared for more meanwhile.
    fn rings_flush_rx(&mut self, port: PortId) -> bool {
        let Some(slot) = self.flows.get_mut(&port) else {
            return false;
        };
        let Some(r) = slot.rings.as_mut() else {
            return false;
        };
        let (sent, again) = r.deliver_held(&mut slot.rx_pending);
        *self.taken.entry(port).or_default() += sent;
        again
    }

    /// Serves normal flow `port` whose application uses shared-memory
    /// rings: drains its kicks, hands it held SDUs, and writes up to
    /// [`BUDGET`] SDUs from its ring into the system (held), which copies
    /// each straight from the ring into its PDUs' buffers.
    fn service_normal_rings(&mut self, now: Instant, port: PortId) -> FlowService {
        let Some(slot) = self.flows.get(&port) else {
            return FlowService::Drained;
        };
        // An application that closed its flow may have written SDUs into
        // the ring just before: they go first, and the flow closes once the
        // ring is empty.
        let open = slot.sock().is_some_and(super::app_rings::drain_kicks);
        let more = if self.rings_flush_rx(port) {
            FlowService::More
        } else {
            FlowService::Drained
        };
        let mut bytes = 0;
        let mut took = false;
        let served = 'turn: {
            for _ in 0..BUDGET {
                if bytes >= BUDGET_BYTES {
                    break;
                }
                let Some(slot) = self.flows.get_mut(&port) else {
                    break 'turn FlowService::Drained;
                };
                if slot.tx_stash.is_some() {
                    break 'turn more;
                }
                let Some(r) = slot.rings.as_mut() else {
                    break 'turn FlowService::Drained;
                };
                let seg = match r.next_from_app() {
                    Ok(Some(seg)) => seg,
                    Ok(None) => break 'turn more,
                    Err(e) => {
                        debug!(port, error = %e, "garbage in a flow's ring; dropped what was published");
                        slot.drops_out += 1;
                        break 'turn more;
                    }
                };
                let len = seg.len();
                bytes += len;
                // The SDU goes from the ring straight into its PDUs' buffers.
                let res = self.sys.write_from_held(now, port, &r.from_app.record(len));
                let stashed = match res {
                    Ok(()) => false,
                    Err(FlowError::WouldBlock) => {
                        let mut sdu = Vec::with_capacity(len);
                        if r.from_app.record(len).append_to(0, len, &mut sdu) {
                            slot.tx_stash = Some(sdu);
                        } else {
                            slot.drops_out += 1;
                        }
                        true
                    }
                    Err(e) => {
                        slot.drops_out += 1;
                        debug!(port, error = %e, "SDU not sent");
                        false
                    }
                };
                r.from_app.consume(len);
                took = true;
                if stashed {
                    break 'turn more;
                }
            }
            FlowService::More
        };
        // Once for the turn: the check for a writer waiting for room
        // orders this side's stores with a full fence.
        if took {
            if let Some(r) = self.flows.get(&port).and_then(|s| s.rings.as_ref()) {
                r.took();
            }
        }
        let slot = self.flows.get(&port).map(|s| &**s);
        if !open && slot.is_some_and(|s| s.tx_stash.is_some()) {
            // What waits for the window may go in the time the system
            // gives a closed flow, no longer.
            self.sys.app_closed(now, port);
        }
        super::app_rings::closed_once_empty(open, served, slot)
    }
}
