//! The UDP driver of a shim-udp IPCP (its socket, receive path and send
//! back-pressure), and the path of application flows straight on a shim
//! over UDP or Ethernet: one read from the application's socket into the
//! daemon's buffer behind room for the header, one send.

use super::shim_eth::{transmit, TxResult};
use super::*;
use mio::net::UdpSocket;
use rina_core::system::{FlowError, Rx};
use std::net::SocketAddr;

/// Frames held for a full socket; beyond this they are lost (counted).
pub(super) const STALL_MAX: usize = 256;

/// A shim-udp IPCP's socket.
pub(super) struct UdpIo {
    pub sock: UdpSocket,
    pub bind: SocketAddr,
    /// Datagrams the kernel refused for reasons other than a full buffer,
    /// and datagrams lost because too many waited for a full one.
    pub send_errors: u64,
    /// Datagrams waiting for the socket to become writable, in order.
    pub stalled: VecDeque<(SocketAddr, Vec<u8>)>,
    /// Application flows whose reading waits for the stall to end.
    pub parked: Vec<PortId>,
    /// Already in the ready queue.
    pub rx_queued: bool,
}

impl UdpIo {
    pub fn new(sock: UdpSocket, bind: SocketAddr) -> Self {
        UdpIo {
            sock,
            bind,
            send_errors: 0,
            stalled: VecDeque::new(),
            parked: Vec::new(),
            rx_queued: false,
        }
    }
}

/// Hands an SDU straight from a medium's buffer to the socket of its
/// application flow; a socket that cannot take it loses it (counted in the
/// shim's flow), as a link would.
pub(super) fn straight_to_app(
    flows: &HashMap<PortId, Box<FlowSlot>>,
    system: &mut System,
    i: usize,
    port: PortId,
    sdu: &[u8],
) {
    let sent = flows
        .get(&port)
        .map(|slot| sys::send(slot.fd.as_raw_fd(), sdu, None));
    if !matches!(sent, Some(Ok(Sent::Done))) {
        count_drop(system, i, port, true);
    }
}

/// Counts an SDU of shim flow `port` of member `i` as dropped, coming in
/// (`inbound`) or going out.
pub(super) fn count_drop(system: &mut System, i: usize, port: PortId, inbound: bool) {
    let c = match system.member_mut(i).map(|m| &mut m.machine) {
        Some(Machine::ShimUdp(s)) => s.flow_counters_mut(port),
        Some(Machine::ShimEth(e)) => e.flow_counters_mut(port),
        Some(Machine::ShimHv(h)) => h.flow_counters_mut(port),
        _ => None,
    };
    if let Some(c) = c {
        if inbound {
            c.drops_in += 1;
        } else {
            c.drops_out += 1;
        }
    }
}

impl Daemon {
    /// Receives up to [`BUDGET`] datagrams of shim-udp IPCP `i`; true if
    /// there may be more.
    pub(super) fn service_udp(&mut self, i: usize) -> bool {
        let now = self.now();
        for _ in 0..BUDGET {
            let Io::Udp(u) = &mut self.ipcps[i].io else {
                return false;
            };
            let (n, from) = match u.sock.recv_from(&mut self.buf) {
                Ok(r) => r,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return false,
                Err(e) => {
                    debug!(ipcp = %self.ipcps[i].name, error = %e, "UDP receive error");
                    return true;
                }
            };
            let rx = Rx::Udp {
                from,
                datagram: &self.buf[..n],
            };
            if let Some((port, sdu)) = self.sys.receive(now, i, rx) {
                straight_to_app(&self.flows, &mut self.sys, i, port, sdu);
            }
        }
        true
    }

    /// Sends a datagram of shim-udp IPCP `i` (its control, or a frame of a
    /// normal IPCP above). A full socket keeps it, in order, and blocks the
    /// N-1 ports over it until the socket is writable: their PDUs wait in
    /// their RMT, where the scheduling policy decides.
    pub(super) fn udp_send(&mut self, i: usize, peer: Option<SocketAddr>, frame: Vec<u8>) {
        let Io::Udp(u) = &mut self.ipcps[i].io else {
            return;
        };
        let Some(to) = peer else {
            u.send_errors += 1;
            return;
        };
        if !u.stalled.is_empty() {
            if u.stalled.len() < STALL_MAX {
                u.stalled.push_back((to, frame));
            } else {
                u.send_errors += 1;
            }
            return;
        }
        match u.sock.send_to(&frame, to) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                u.stalled.push_back((to, frame));
                let _ = self.poll.registry().reregister(
                    &mut u.sock,
                    token(T_UDP, i),
                    Interest::READABLE | Interest::WRITABLE,
                );
                let now = self.now();
                self.sys.medium_blocked(now, i);
            }
            Err(e) => {
                u.send_errors += 1;
                debug!(ipcp = %self.ipcps[i].name, %to, error = %e, "UDP send failed");
            }
        }
    }

    /// The socket of shim-udp IPCP `i` is writable again: send what waited,
    /// then read the parked flows and open the N-1 ports over it.
    pub(super) fn unstall(&mut self, i: usize) {
        let Io::Udp(u) = &mut self.ipcps[i].io else {
            return;
        };
        while let Some((to, d)) = u.stalled.front() {
            match u.sock.send_to(d, *to) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(_) => u.send_errors += 1,
                Ok(_) => {}
            }
            u.stalled.pop_front();
        }
        let _ = self
            .poll
            .registry()
            .reregister(&mut u.sock, token(T_UDP, i), Interest::READABLE);
        for port in std::mem::take(&mut u.parked) {
            self.mark_flow_ready(port);
        }
        let now = self.now();
        self.sys.medium_writable(now, i);
        self.drain_outputs();
    }

    /// Whether the medium of shim IPCP `i` holds frames for lack of room.
    pub(super) fn medium_stalled(&self, i: usize) -> bool {
        match &self.ipcps[i].io {
            Io::Udp(u) => !u.stalled.is_empty(),
            Io::Eth(e) => !e.stalled.is_empty(),
            Io::Hv(h) => h.stalled(),
            Io::Normal(_) | Io::Removed => false,
        }
    }

    /// Application flow `port` waits for the medium of IPCP `i`.
    fn park(&mut self, i: usize, port: PortId) {
        let parked = match &mut self.ipcps[i].io {
            Io::Udp(u) => &mut u.parked,
            Io::Eth(e) => &mut e.parked,
            _ => return,
        };
        if !parked.contains(&port) {
            parked.push(port);
        }
    }

    /// Reads up to [`BUDGET`] SDUs the application wrote on flow `port`
    /// straight on a shim over UDP or Ethernet and sends them, one frame
    /// each, the shim's header written in front of the SDU in place.
    pub(super) fn service_shim_flow(&mut self, port: PortId) -> FlowService {
        let Some(slot) = self.flows.get(&port) else {
            return FlowService::Drained;
        };
        let (i, fd) = (slot.ipcp, slot.fd.as_raw_fd());
        if self.medium_stalled(i) {
            self.park(i, port);
            return FlowService::Drained;
        }
        let now = self.now();
        let cap = self.buf.len() - HEADROOM;
        for _ in 0..BUDGET {
            let n = match sys::recv(fd, &mut self.buf[HEADROOM..]) {
                Ok(Recv::Packet(n)) => n,
                // Refused (and counted) by the machine, like any bad SDU.
                Ok(Recv::Empty) => 0,
                Ok(Recv::WouldBlock) => return FlowService::Drained,
                Ok(Recv::Closed) => return FlowService::Closed,
                Err(e) => {
                    debug!(port, error = %e, "flow read error");
                    return FlowService::Closed;
                }
            };
            if n > cap {
                count_drop(&mut self.sys, i, port, false);
                continue;
            }
            let send = match self.sys.shim_send(now, port, n) {
                Ok((_, send)) => send,
                Err(FlowError::WouldBlock) => {
                    count_drop(&mut self.sys, i, port, false);
                    self.park(i, port);
                    return FlowService::Drained;
                }
                Err(e) => {
                    debug!(port, error = %e, "SDU not sent");
                    continue;
                }
            };
            let hdr = send.header();
            let start = HEADROOM - hdr.len();
            self.buf[start..HEADROOM].copy_from_slice(hdr);
            let frame = &self.buf[start..HEADROOM + n];
            let full = match &mut self.ipcps[i].io {
                Io::Udp(u) => {
                    let Some(to) = send.peer else {
                        continue;
                    };
                    match u.sock.send_to(frame, to) {
                        Ok(_) => false,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            u.stalled.push_back((to, frame.to_vec()));
                            u.parked.push(port);
                            let _ = self.poll.registry().reregister(
                                &mut u.sock,
                                token(T_UDP, i),
                                Interest::READABLE | Interest::WRITABLE,
                            );
                            true
                        }
                        Err(e) => {
                            u.send_errors += 1;
                            debug!(%to, error = %e, "UDP send failed");
                            false
                        }
                    }
                }
                Io::Eth(e) => match transmit(e.sock.as_raw_fd(), &mut e.impair, &[frame]) {
                    TxResult::Sent => false,
                    TxResult::Full => {
                        e.stalled.push_back(frame.to_vec());
                        e.parked.push(port);
                        let _ = self.poll.registry().reregister(
                            &mut SourceFd(&e.sock.as_raw_fd()),
                            token(T_ETH, i),
                            Interest::READABLE | Interest::WRITABLE,
                        );
                        true
                    }
                    TxResult::Failed(err) => {
                        e.send_errors += 1;
                        debug!(port, error = %err, "frame not sent");
                        false
                    }
                },
                _ => return FlowService::Drained,
            };
            if full {
                self.sys.medium_blocked(now, i);
                return FlowService::Drained;
            }
        }
        FlowService::More
    }
}
