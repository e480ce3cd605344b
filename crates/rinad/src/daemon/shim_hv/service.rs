//! The daemon's service of its shim-hv IPCPs: ticks, the rings, the
//! flows' reads and writes, back-pressure and credit.

use super::*;

/// The driver and the machine of shim-hv IPCP `i`, borrowed together.
fn parts<'a>(
    ipcps: &'a mut [Ipcp],
    sys: &'a mut System,
    i: usize,
) -> Option<(&'a mut HvIo, &'a mut ShimHv)> {
    let Io::Hv(h) = &mut ipcps.get_mut(i)?.io else {
        return None;
    };
    let Some(Machine::ShimHv(m)) = sys.member_mut(i).map(|m| &mut m.machine) else {
        return None;
    };
    Some((h, m))
}

impl Daemon {
    /// When the next shim-hv tick is due (now, for busy-polling IPCPs).
    pub(in crate::daemon) fn hv_timeout(&self) -> Option<Instant> {
        self.ipcps
            .iter()
            .filter_map(|ip| match &ip.io {
                Io::Hv(h) => {
                    let tick = h.ticker.poll_timeout(h.busy_poll);
                    Some(h.relay_wake.map_or(tick, |t| t.min(tick)))
                }
                _ => None,
            })
            .min()
    }

    /// Runs the due ticks of shim-hv IPCPs: attach, doorbell exchange,
    /// heartbeats, sends held back, and a poll of the receive ring.
    pub(in crate::daemon) fn hv_ticks(&mut self, now: Instant) {
        // Relay pauses that are over: read a batch.
        let mut over = Vec::new();
        for (i, ip) in self.ipcps.iter_mut().enumerate() {
            if let Io::Hv(h) = &mut ip.io {
                if h.relay_wake.is_some_and(|t| t <= now) {
                    h.relay_wake = None;
                    over.push(i);
                }
            }
        }
        for i in over {
            self.mark_medium_ready(i);
        }
        for i in 0..self.ipcps.len() {
            let Some(side) = (match self.machine(i) {
                Some(Machine::ShimHv(m)) => Some(m.config().side),
                _ => None,
            }) else {
                continue;
            };
            let ipcp = &mut self.ipcps[i];
            let name = &ipcp.name;
            let Io::Hv(h) = &mut ipcp.io else {
                continue;
            };
            if !h.ticker.due(now, h.busy_poll) {
                continue;
            }
            if h.att.is_none() && side == Side::Guest {
                match open_region(&h.path, Side::Guest, h.session) {
                    Ok(a) => {
                        info!(ipcp = %name, "shim-hv guest attached");
                        h.att = Some(a);
                    }
                    Err(e) => {
                        h.attach_errors += 1;
                        let why = e.to_string();
                        if e.kind() == io::ErrorKind::PermissionDenied
                            && h.attach_refused.as_ref() != Some(&why)
                        {
                            warn!(ipcp = %name, error = %why, "shim-hv guest: file refused");
                            h.attach_refused = Some(why);
                        }
                    }
                }
            }
            h.bell.step(side, h.att.is_some(), now);
            if !h.bell.registered {
                if let Some(fd) = &h.bell.conn {
                    // Its readiness is served as the IPCP's (see service_hv).
                    h.bell.registered = self
                        .poll
                        .registry()
                        .register(
                            &mut SourceFd(&fd.as_raw_fd()),
                            token(T_UDP, i),
                            Interest::READABLE,
                        )
                        .is_ok();
                }
            }
            h.ticker.ran(now, h.sleeps_on_bell());
            let Some(a) = &mut h.att else {
                continue;
            };
            match a.link.tick(now) {
                Some(LinkEvent::Up) => {
                    info!(ipcp = %name, "shim-hv peer up");
                    self.sys.hv_peer(now, i, true);
                }
                Some(LinkEvent::Down) => {
                    warn!(ipcp = %name, "shim-hv peer gone; its flows are closed");
                    h.backlog.clear();
                    h.n1_backlog.clear();
                    h.stalled = None;
                    h.credit_parked.clear();
                    self.sys.hv_peer(now, i, false);
                    self.sys.medium_writable(now, i);
                }
                None => {}
            }
            self.mark_medium_ready(i);
        }
    }

    /// Sends what waits for room in the send ring of shim-hv IPCP `i`,
    /// reads the flows parked on it once it all went, and opens the N-1
    /// ports over it once its backlog is less than a quarter full.
    fn hv_flush_tx(&mut self, i: usize) {
        let now = self.now();
        let Some((h, m)) = parts(&mut self.ipcps, &mut self.sys, i) else {
            return;
        };
        let was_congested = h.n1_backlog.is_congested();
        let was_filling = h.n1_backlog.is_filling();
        let (flushed, again) = if h.flush(m) {
            (std::mem::take(&mut h.parked), false)
        } else {
            (Vec::new(), h.arm_tx())
        };
        let relieved = was_filling && !h.n1_backlog.is_filling();
        for port in flushed {
            self.mark_flow_ready(port);
        }
        if again {
            self.mark_medium_ready(i);
        }
        if relieved {
            self.sys.medium_writable(now, i);
        }
        if was_congested && !self.hv_congested_besides(usize::MAX) {
            // Rings whose reading paused for this backlog are read again.
            for k in self.sys.hv_relay_released() {
                if let Some(Io::Hv(h)) = self.ipcps.get_mut(k).map(|ip| &mut ip.io) {
                    h.relay_wake = None;
                }
                self.mark_medium_ready(k);
            }
        }
    }

    /// Whether the backlog of stacked IPCPs' frames of a shim-hv IPCP
    /// other than `i` is at least half full.
    fn hv_congested_besides(&self, i: usize) -> bool {
        self.ipcps.iter().enumerate().any(|(k, ip)| match &ip.io {
            Io::Hv(h) => k != i && h.n1_backlog.is_congested(),
            _ => false,
        })
    }

    /// Hop-by-hop back-pressure for relays: whether the receive ring of
    /// shim-hv IPCP `i` is left unread now, as the core decides
    /// (`System::hv_may_read`) from whether another shim-hv backlog is
    /// congested; a paused ring is read again at the time the core gives.
    fn hv_relay_blocked(&mut self, i: usize, now: Instant) -> bool {
        let congested = self.hv_congested_besides(i);
        let wake = match self.sys.hv_may_read(now, i, congested) {
            RelayRead::Now => None,
            RelayRead::PausedUntil(t) => Some(t),
        };
        if let Io::Hv(h) = &mut self.ipcps[i].io {
            h.relay_wake = wake;
        }
        wake.is_some()
    }

    /// Serves shim-hv IPCP `i` (its tick, its doorbell, or more to read):
    /// sends what waited, then takes up to [`BUDGET`] buffers from the
    /// receive ring; true if there may be more.
    pub(in crate::daemon) fn service_hv(&mut self, i: usize) -> bool {
        let now = self.now();
        if let Io::Hv(h) = &mut self.ipcps[i].io {
            if h.bell.drain() > 0 {
                h.bell.wakeups += 1;
            }
        }
        self.hv_flush_tx(i);
        if self.hv_relay_blocked(i, now) {
            return false;
        }
        if let Io::Hv(h) = &mut self.ipcps[i].io {
            // Queues of flows closed meanwhile are dropped, and do not pause.
            h.rx_pending.retain(|p, _| self.flows.contains_key(p));
            let resume = match h.rx_paused {
                // Its application kicks once it read, unless it closed.
                Some(RxPause::InRing(p)) => !self.flows.contains_key(&p),
                Some(RxPause::Held(p)) => rx_may_resume(p, &h.rx_pending),
                None => false,
            };
            if resume {
                h.rx_paused = None;
            }
            if h.rx_paused.is_some() {
                return false;
            }
        }
        let mut more = true;
        for _ in 0..BUDGET {
            match self.hv_take_one(i, now) {
                Some(true) => {}
                Some(false) => {
                    more = false;
                    break;
                }
                None => {
                    // Empty: sleep on the doorbell if the peer will ring it.
                    more = false;
                    if let Io::Hv(h) = &self.ipcps[i].io {
                        if let Some(a) = &h.att {
                            if h.sleeps_on_bell() && !a.link.arm_rx() {
                                more = true;
                            }
                        }
                    }
                    break;
                }
            }
        }
        // After any slot was freed (also by a read that then stopped):
        // ring a producer that sleeps on a full ring.
        if let Io::Hv(h) = &mut self.ipcps[i].io {
            if let Some(a) = &h.att {
                if h.bell.on() && a.link.peer_wants_room() {
                    h.bell.ring();
                }
            }
        }
        self.hv_credit_moved(i, now);
        more
    }

    /// Tells the machine of shim-hv IPCP `i` that an SDU of `len` bytes of
    /// flow `port` reached its application, and sends what follows.
    fn hv_delivered(&mut self, now: Instant, i: usize, port: PortId, len: u64) {
        self.sys.with_machine(now, i, |m| {
            if let Machine::ShimHv(h) = m {
                h.delivered(now, port, 1, len);
            }
        });
    }

    /// After buffers came in or SDUs went to applications on shim-hv IPCP
    /// `i`: flows that waited for credit and got some are read again, and
    /// the grants the machine made for what applications took are sent.
    fn hv_credit_moved(&mut self, i: usize, now: Instant) {
        let Some((h, m)) = parts(&mut self.ipcps, &mut self.sys, i) else {
            return;
        };
        let mut go = Vec::new();
        h.credit_parked.retain(|&p| {
            let can = m.may_send(p);
            if can {
                go.push(p);
            }
            !can
        });
        let grants = m.has_actions();
        for p in go {
            self.mark_flow_ready(p);
        }
        if grants {
            self.sys.settle(now);
        }
    }

    /// Takes one buffer from the receive ring of shim-hv IPCP `i`: `None`
    /// if the ring is empty, `Some(false)` if reading must stop (garbage,
    /// or an application's queue is full), `Some(true)` otherwise. SDUs of
    /// application flows go from the ring to the application without a
    /// copy in the daemon; control buffers and frames of normal IPCPs
    /// above go to the system from one copy.
    fn hv_take_one(&mut self, i: usize, now: Instant) -> Option<bool> {
        let mut tapped = self.sys.medium_tapped(i).then_some(None);
        let took = self.hv_take_one_inner(i, now, &mut tapped);
        if let Some(Some(frame)) = tapped {
            self.sys.tap_moved(i, false, frame);
        }
        took
    }

    /// A VMPI buffer of no application flow (control, a frame of a normal
    /// IPCP above, or garbage), copied to the first `n` bytes of the
    /// daemon's buffer: to the system, and what it delivers to its flow.
    fn hv_copy_to_system(&mut self, i: usize, now: Instant, n: usize) {
        let rx = rina_core::system::Rx::Hv {
            buf: &self.buf[..n],
        };
        if let Some((port, sdu)) = self.sys.receive(now, i, rx) {
            let len = sdu.len() as u64;
            super::shim::straight_to_app(&mut self.flows, &mut self.sys, i, port, sdu);
            self.hv_delivered(now, i, port, len);
        }
    }

    /// [`Daemon::hv_take_one`]; a buffer of an application flow that left
    /// the ring is copied into `tapped` if it is `Some` (a capture).
    fn hv_take_one_inner(
        &mut self,
        i: usize,
        now: Instant,
        tapped: &mut Option<Option<Vec<u8>>>,
    ) -> Option<bool> {
        let name = self.ipcps[i].name.clone();
        let (h, m) = parts(&mut self.ipcps, &mut self.sys, i)?;
        let Some(a) = &mut h.att else {
            return Some(false);
        };
        let seg = match a.link.peek() {
            Ok(Some(s)) => s,
            Ok(None) => return None,
            Err(e) => {
                h.rx_ring_errors += 1;
                debug!(ipcp = %name, error = %e, "garbage in the receive ring; dropped what was published");
                return Some(false);
            }
        };
        let n = seg.len();
        let mut ch = [0u8; CHANNEL_HEADER];
        let app_port = (n > CHANNEL_HEADER && a.link.read_peeked(n, &mut ch))
            .then(|| m.channel_port(u32::from_le_bytes(ch)))
            .flatten()
            .filter(|p| self.flows.contains_key(p));
        let Some(port) = app_port else {
            // Control, a frame of a normal IPCP above, or garbage: to the
            // system from a copy.
            let copied = n <= self.buf.len() && a.link.read_peeked(n, &mut self.buf[..n]);
            a.link.consume(n);
            if !copied {
                // Larger than any buffer the DIF carries: garbage, counted.
                h.rx_ring_errors += 1;
                debug!(ipcp = %name, len = n, "VMPI buffer larger than any the DIF carries; dropped");
                return Some(true);
            }
            self.hv_copy_to_system(i, now, n);
            return Some(true);
        };
        let sdu_len = n - CHANNEL_HEADER;
        if let Some(t) = tapped.as_mut() {
            *t = Some(seg.to_vec());
        }
        if let Err(reason) = m.on_data_header(u32::from_le_bytes(ch), sdu_len) {
            a.link.consume(n);
            debug!(ipcp = %name, ?reason, "VMPI buffer dropped");
            return Some(true);
        }
        let sdu = seg.skip(CHANNEL_HEADER);
        let mut ready = None;
        // With credit, what the application cannot take yet is held here
        // (at most the window the machine granted): the ring is never left
        // unread for one flow.
        let credit = m.rx_flow_controlled(port);
        let taken = if let Some(r) = self.flows.get_mut(&port).and_then(|fs| fs.rings.as_mut()) {
            // Ring to ring, unless SDUs are held before it.
            let held = h.rx_pending.get(&port).is_some_and(|q| !q.is_empty());
            if !held {
                if let Ok(dst) = r.to_app.reserve(sdu_len) {
                    sdu.copy_to(&dst);
                    let ok = r.to_app.commit(sdu_len, sdu_len).is_ok();
                    a.link.consume(n);
                    if ok {
                        r.wake();
                    }
                    m.delivered(now, port, 1, sdu_len as u64);
                    return Some(true);
                }
            }
            if !held && !credit {
                // The application's ring is full: the SDU stays in the VMPI
                // ring (no copy) and the ring is not read until the
                // application kicks, which fills the peer's ring and holds
                // its writers back.
                m.unreceive(port, sdu_len);
                // Still in the ring: captured when it leaves.
                *tapped = None;
                if r.want_room(sdu_len) {
                    return Some(true);
                }
                h.rx_paused = Some(RxPause::InRing(port));
                h.rx_ring_waits += 1;
                return Some(false);
            }
            let Some(q) = hold_copy(&mut a.link, n, h.rx_pending.entry(port).or_default()) else {
                m.delivered(now, port, 1, sdu_len as u64);
                return Some(true);
            };
            // The application kicks once it made room (or room is there now).
            if q.front().is_some_and(|f| !r.to_app.arm(f.len())) {
                ready = Some(port);
            }
            let len = q.len();
            let full = h.note_held(len) && !credit;
            if full {
                h.rx_paused = Some(RxPause::Held(port));
            }
            Some(!full)
        } else {
            let fd = self.flows.get(&port).and_then(|fs| fs.sock())?;
            let held = h.rx_pending.get(&port).is_some_and(|q| !q.is_empty());
            // Straight from the ring to the application's socket.
            let sent = if held {
                Ok(Sent::WouldBlock)
            } else {
                send_from(fd, &sdu)
            };
            match sent {
                Ok(Sent::Done) => {
                    a.link.consume(n);
                    m.delivered(now, port, 1, sdu_len as u64);
                    Some(true)
                }
                Ok(Sent::WouldBlock) => {
                    let Some(q) = hold_copy(&mut a.link, n, h.rx_pending.entry(port).or_default())
                    else {
                        m.delivered(now, port, 1, sdu_len as u64);
                        return Some(true);
                    };
                    // Held within the window with credit; without, the
                    // ring pauses at RX_QUEUE_MAX.
                    let len = q.len();
                    let full = h.note_held(len) && !credit;
                    let _ = self.poll.registry().reregister(
                        &mut SourceFd(&fd),
                        token(T_FLOW, port as usize),
                        Interest::READABLE | Interest::WRITABLE,
                    );
                    if full {
                        h.rx_paused = Some(RxPause::Held(port));
                    }
                    Some(!full)
                }
                _ => {
                    a.link.consume(n);
                    if let Some(c) = m.flow_counters_mut(port) {
                        c.drops_in += 1;
                    }
                    m.delivered(now, port, 1, sdu_len as u64);
                    Some(true)
                }
            }
        };
        if let Some(p) = ready {
            self.mark_flow_ready(p);
        }
        taken
    }

    /// The application's socket of shim-hv flow `port` can take more: hand
    /// it what was held, and read the ring again if it was paused for it.
    pub(in crate::daemon) fn hv_flush_rx(&mut self, port: PortId) {
        let Some(slot) = self.flows.get(&port) else {
            return;
        };
        if slot.rings.is_some() {
            // Held SDUs go to the ring when the application kicks.
            return;
        }
        let (Some(fd), i) = (slot.sock(), slot.ipcp) else {
            return;
        };
        let now = self.now();
        let Some((h, m)) = parts(&mut self.ipcps, &mut self.sys, i) else {
            return;
        };
        let Some(q) = h.rx_pending.get_mut(&port) else {
            return;
        };
        let (mut sdus, mut bytes) = (0u64, 0u64);
        while let Some(sdu) = q.front() {
            match sys::send(fd, sdu, None) {
                Ok(Sent::Done) => {}
                Ok(Sent::WouldBlock) => break,
                _ => {
                    // Gone with the flow: their credit too.
                    sdus += q.len() as u64;
                    bytes += q.iter().map(|v| v.len() as u64).sum::<u64>();
                    q.clear();
                    break;
                }
            }
            sdus += 1;
            bytes += sdu.len() as u64;
            q.pop_front();
        }
        m.delivered(now, port, sdus, bytes);
        if q.is_empty() {
            h.rx_pending.remove(&port);
            let _ = self.poll.registry().reregister(
                &mut SourceFd(&fd),
                token(T_FLOW, port as usize),
                Interest::READABLE,
            );
        }
        // Paused for this flow or another: what this one gave up may be
        // what the pause waited for.
        if let Some(RxPause::Held(p)) = h.rx_paused {
            if rx_may_resume(p, &h.rx_pending) {
                h.rx_paused = None;
                self.mark_medium_ready(i);
            }
        }
        self.hv_credit_moved(i, now);
    }

    /// Sends a buffer the system asked for on shim-hv IPCP `i`: control
    /// messages through their backlog, frames of normal IPCPs above
    /// through theirs. While that backlog is a quarter full the N-1 ports over
    /// this IPCP are blocked, so PDUs wait in the RMT above, where the
    /// scheduling policy decides; only what overflows the backlog is lost
    /// (counted as `tx_ring_full`).
    pub(in crate::daemon) fn hv_send(&mut self, i: usize, frame: PduBuf) {
        let now = self.now();
        let Io::Hv(h) = &mut self.ipcps[i].io else {
            return;
        };
        let control = frame
            .get(..CHANNEL_HEADER)
            .is_none_or(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) == CONTROL_CHANNEL);
        if control {
            h.send_control(frame.into_vec());
            return;
        }
        let Some(a) = &mut h.att else {
            return;
        };
        let was_waiting = !h.n1_backlog.is_empty();
        let was_filling = h.n1_backlog.is_filling();
        // Control messages waiting go first: they may open the channel.
        let out = if h.backlog.is_empty() {
            h.n1_backlog.send(&mut a.link, &[&frame])
        } else {
            h.n1_backlog.queue_only(&[&frame])
        };
        let mut again = false;
        match out {
            BacklogOutcome::Sent => h.wake_peer_for_data(),
            BacklogOutcome::Queued => again = !was_waiting && h.arm_tx(),
            BacklogOutcome::Overflow => {}
            BacklogOutcome::Failed(e) => {
                if matches!(e, RingError::BadIndex { .. }) {
                    h.tx_ring_errors += 1;
                }
            }
        }
        let filling = !was_filling && h.n1_backlog.is_filling();
        if filling {
            h.upper_blocks += 1;
        }
        if again {
            self.mark_medium_ready(i);
        }
        if filling {
            self.sys.medium_blocked(now, i);
        }
    }

    /// Reads up to [`BUDGET`] SDUs written by the application on shim-hv
    /// flow `port` and puts them in the send ring: straight from the
    /// socket into a reserved record when the ring has room for the
    /// largest SDU, else through the daemon's buffer.
    pub(in crate::daemon) fn service_hv_flow(&mut self, port: PortId) -> FlowService {
        let Some(slot) = self.flows.get(&port) else {
            return FlowService::Drained;
        };
        if slot.rings.is_some() {
            return self.service_hv_rings(port);
        }
        let (i, Some(fd)) = (slot.ipcp, slot.sock()) else {
            return FlowService::Drained;
        };
        // Copies of what is sent, for a capture of the medium.
        let tap = self.sys.medium_tapped(i);
        let mut copies: Vec<Vec<u8>> = Vec::new();
        let Some((h, m)) = parts(&mut self.ipcps, &mut self.sys, i) else {
            return FlowService::Drained;
        };
        if h.stalled() {
            h.park(port);
            return FlowService::Drained;
        }
        let cap = self.buf.len() - HEADROOM;
        let max_sdu = m.config().max_sdu as usize;
        // Room for the channel header, the largest SDU and one byte more
        // (to tell a too-large SDU from a fitting one).
        let reserve = CHANNEL_HEADER + max_sdu + 1;
        let mut result = FlowService::More;
        let mut sent = 0;
        for _ in 0..BUDGET {
            let Some(a) = &mut h.att else {
                break;
            };
            if !m.may_send(port) {
                // Out of credit: this flow only waits (its application's
                // writes block), read again when the peer grants more.
                h.park_for_credit(port);
                result = FlowService::Drained;
                break;
            }
            if let Ok(seg) = a.link.reserve(reserve) {
                let n = match sdu_len(recv_into(fd, &seg.skip(CHANNEL_HEADER)), port) {
                    Ok(n) => n,
                    Err(end) => {
                        result = end;
                        break;
                    }
                };
                let hdr = match m.send_header(port, n) {
                    Ok(hdr) => hdr,
                    Err(e) => {
                        debug!(port, error = %e, "SDU not sent");
                        continue;
                    }
                };
                seg.write_at(0, &hdr);
                if tap {
                    copies.push(seg.prefix(CHANNEL_HEADER + n).to_vec());
                }
                match a.link.commit(reserve, CHANNEL_HEADER + n) {
                    Ok(()) => sent += 1,
                    Err(e) => {
                        if matches!(e, RingError::BadIndex { .. }) {
                            h.tx_ring_errors += 1;
                        }
                        m.unsend(port, n);
                        debug!(port, error = %e, "SDU not sent");
                    }
                }
                continue;
            }
            // Less room than the largest SDU needs: through our buffer.
            let n = match sdu_len(sys::recv(fd, &mut self.buf[HEADROOM..]), port) {
                Ok(n) => n,
                Err(end) => {
                    result = end;
                    break;
                }
            };
            if n > cap {
                if let Some(c) = m.flow_counters_mut(port) {
                    c.drops_out += 1;
                }
                continue;
            }
            let hdr = match m.send_header(port, n) {
                Ok(h) => h,
                Err(e) => {
                    debug!(port, error = %e, "SDU not sent");
                    continue;
                }
            };
            let sdu = &self.buf[HEADROOM..HEADROOM + n];
            if tap {
                // Sent now, or once the ring has room (stalled below).
                copies.push([&hdr[..], sdu].concat());
            }
            match a.link.send(&[&hdr, sdu]) {
                Ok(()) => sent += 1,
                Err(e @ (RingError::Full | RingError::BadIndex { .. })) => {
                    if matches!(e, RingError::BadIndex { .. }) {
                        h.tx_ring_errors += 1;
                    }
                    let mut b = hdr.to_vec();
                    b.extend_from_slice(sdu);
                    h.stalled = Some((port, b));
                    h.park(port);
                    result = FlowService::Drained;
                    break;
                }
                Err(e) => {
                    m.unsend(port, n);
                    debug!(port, error = %e, "SDU not sent");
                }
            }
        }
        if sent > 0 {
            h.wake_peer_for_data();
        }
        if h.stalled.is_some() && h.arm_tx() {
            self.mark_medium_ready(i);
        }
        for c in copies {
            self.sys.tap_moved(i, true, c);
        }
        result
    }

    /// Serves shim-hv flow `port` whose application uses rings (it kicked
    /// the socket, or the flow was parked): drains the kicks, hands SDUs
    /// held for the application to its ring, and moves up to
    /// `4 * BUDGET` SDUs from its ring into the VMPI send ring, copying
    /// ring to ring.
    fn service_hv_rings(&mut self, port: PortId) -> FlowService {
        let now = self.now();
        let Some(slot) = self.flows.get_mut(&port) else {
            return FlowService::Drained;
        };
        let (i, Some(fd)) = (slot.ipcp, slot.sock()) else {
            return FlowService::Drained;
        };
        if !super::app_rings::drain_kicks(fd) {
            return FlowService::Closed;
        }
        let Some(r) = &mut slot.rings else {
            return FlowService::Drained;
        };
        let tap = self.sys.medium_tapped(i);
        let mut copies: Vec<Vec<u8>> = Vec::new();
        let Some((h, m)) = parts(&mut self.ipcps, &mut self.sys, i) else {
            return FlowService::Drained;
        };
        // Held SDUs first, in order.
        let (mut resume_rx, mut again) = (false, false);
        if h.rx_paused == Some(RxPause::InRing(port)) {
            // Paused with the SDU left in the VMPI ring: the application read.
            h.rx_paused = None;
            resume_rx = true;
        }
        if let Some(q) = h.rx_pending.get_mut(&port) {
            let before = q.bytes();
            let (sent, more) = r.deliver_held(q);
            again = more;
            m.delivered(now, port, sent as u64, (before - q.bytes()) as u64);
            if q.is_empty() {
                h.rx_pending.remove(&port);
            }
            // Paused for this flow or another (see `hv_flush_rx`).
            if let Some(RxPause::Held(p)) = h.rx_paused {
                if rx_may_resume(p, &h.rx_pending) {
                    h.rx_paused = None;
                    resume_rx = true;
                }
            }
        }
        if h.stalled() {
            h.park(port);
            if resume_rx {
                self.mark_medium_ready(i);
            }
            let now = self.now();
            self.hv_credit_moved(i, now);
            return if again {
                FlowService::More
            } else {
                FlowService::Drained
            };
        }
        let max_sdu = m.config().max_sdu as usize;
        let (mut sent, mut result, mut full) = (0, FlowService::More, None);
        for _ in 0..4 * BUDGET {
            let Some(a) = &mut h.att else {
                result = FlowService::Drained;
                break;
            };
            if !m.may_send(port) {
                h.park_for_credit(port);
                result = FlowService::Drained;
                break;
            }
            let seg = match r.next_from_app() {
                Ok(Some(seg)) => seg,
                Ok(None) => {
                    result = FlowService::Drained;
                    break;
                }
                Err(e) => {
                    // The application wrote garbage: its own flow suffers.
                    debug!(port, error = %e, "garbage in a flow's ring; dropped what was published");
                    if let Some(c) = m.flow_counters_mut(port) {
                        c.drops_out += 1;
                    }
                    result = FlowService::Drained;
                    break;
                }
            };
            let n = seg.len();
            if n > max_sdu {
                r.from_app.consume(n);
                if let Some(c) = m.flow_counters_mut(port) {
                    c.drops_out += 1;
                }
                continue;
            }
            let need = CHANNEL_HEADER + n;
            let dst = match a.link.reserve(need) {
                Ok(d) => d,
                Err(e) => {
                    if matches!(e, RingError::BadIndex { .. }) {
                        h.tx_ring_errors += 1;
                    }
                    full = Some(need);
                    result = FlowService::Drained;
                    break;
                }
            };
            let hdr = match m.send_header(port, n) {
                Ok(hdr) => hdr,
                Err(e) => {
                    debug!(port, error = %e, "SDU not sent");
                    r.from_app.consume(n);
                    continue;
                }
            };
            dst.write_at(0, &hdr);
            seg.copy_to(&dst.skip(CHANNEL_HEADER));
            r.from_app.consume(n);
            if tap {
                copies.push(dst.prefix(need).to_vec());
            }
            match a.link.commit(need, need) {
                Ok(()) => sent += 1,
                Err(e) => {
                    m.unsend(port, n);
                    debug!(port, error = %e, "SDU not sent");
                }
            }
        }
        r.took();
        if sent > 0 {
            h.wake_peer_for_data();
        }
        if let Some(need) = full {
            // The VMPI ring is full: read on when the peer frees slots.
            h.park(port);
            if h.arm_tx_for(need) {
                result = FlowService::More;
            }
        }
        if resume_rx {
            self.mark_medium_ready(i);
        }
        if again {
            result = FlowService::More;
        }
        for c in copies {
            self.sys.tap_moved(i, true, c);
        }
        let now = self.now();
        self.hv_credit_moved(i, now);
        result
    }
}
