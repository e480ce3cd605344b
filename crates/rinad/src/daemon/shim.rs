//! The UDP driver of a shim-udp IPCP (its socket, receive path and send
//! back-pressure), and the path of application flows straight on a shim
//! over UDP or Ethernet: each SDU read from the application's socket into
//! a buffer behind room for the header, the header written in place.
//!
//! UDP goes in batches ([`crate::udp_batch`]): the frames a turn of the
//! loop produces for a socket leave in one `sendmmsg` (runs to one peer
//! segmented by the kernel), and a read takes up to
//! [`RX_SLOTS`](crate::udp_batch::RX_SLOTS) coalesced reads at once.

use super::*;
use crate::udp_batch::{self, Receiver, Sender};
use mio::net::UdpSocket;
use rina_core::system::{FlowError, PduBuf};
use std::net::SocketAddr;
use std::ops::Range;

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
    pub stalled: VecDeque<(SocketAddr, PduBuf)>,
    /// Application flows whose reading waits for the stall to end.
    pub parked: Vec<PortId>,
    /// Already in the ready queue.
    pub rx_queued: bool,
    /// Frames of this turn of the loop, sent together at its end (or when
    /// [`BUDGET`] have gathered).
    pub out: Vec<(SocketAddr, PduBuf)>,
    /// The socket's batches (and which offloads its path allows).
    pub sender: Sender,
    /// Whether the socket coalesces what it receives (`UDP_GRO`).
    pub gro: bool,
    /// Receive system calls made.
    pub rx_calls: u64,
    /// Datagrams copied out of a read rather than handed up in their buffer.
    pub rx_copied: u64,
}

impl UdpIo {
    pub fn new(sock: UdpSocket, bind: SocketAddr) -> Self {
        let gro = udp_batch::enable_gro(sock.as_raw_fd());
        UdpIo {
            sock,
            bind,
            send_errors: 0,
            stalled: VecDeque::new(),
            parked: Vec::new(),
            rx_queued: false,
            out: Vec::new(),
            sender: Sender::new(),
            gro,
            rx_calls: 0,
            rx_copied: 0,
        }
    }

    /// Keeps what a full socket did not take, in order, up to
    /// [`STALL_MAX`]; beyond that it is lost (counted).
    fn stall<F: Into<PduBuf>>(&mut self, rest: impl Iterator<Item = (SocketAddr, F)>) {
        for (to, f) in rest {
            if self.stalled.len() < STALL_MAX {
                self.stalled.push_back((to, f.into()));
            } else {
                self.send_errors += 1;
            }
        }
    }
}

/// What the UDP drivers of a daemon share: the receive buffers and the
/// batch of application SDUs being read.
#[derive(Default)]
pub(super) struct UdpShared {
    rx: Receiver,
    /// SDUs of one application flow, each behind room for the header.
    arena: Vec<u8>,
    /// The frames in `arena`, with their peers (UDP).
    frames: Vec<(Option<SocketAddr>, Range<usize>)>,
    /// Shim-udp and shim-eth IPCPs with frames in their `out`.
    pub dirty: Vec<usize>,
    /// Application flows given SDUs in this read (to wake once).
    pub(super) woken: Vec<PortId>,
}

/// What an application's socket or ring gave for the batch.
enum Got {
    /// An SDU of this many bytes, in the room given.
    Sdu(usize),
    /// An SDU too large or unreadable: lost (counted).
    Drop,
    /// No more now: how the flow was served.
    Stop(FlowService),
}

/// What became of an SDU made into a frame.
enum Framed {
    /// In the batch.
    Added,
    /// Refused by the machine or without a peer (counted there).
    Skipped,
    /// The flow cannot send now: it waits (parked), the SDU is lost.
    Wait,
}

/// Bytes of [`UdpShared::arena`]: room for at least four SDUs of the
/// largest size, and for a whole [`BUDGET`] of full-sized Ethernet ones.
const ARENA: usize = 4 * (HEADROOM + 65_537);

/// Hands an SDU straight from a medium's buffer to its application flow
/// (its ring, or its socket); a flow that cannot take it loses it (counted
/// in the shim's flow), as a link would.
pub(super) fn straight_to_app(
    flows: &mut IdMap<PortId, Box<FlowSlot>>,
    system: &mut System,
    i: usize,
    port: PortId,
    sdu: &[u8],
) {
    queue_to_app(flows, system, i, port, sdu);
    if let Some(r) = flows.get(&port).and_then(|s| s.rings.as_ref()) {
        r.wake();
    }
}

/// [`straight_to_app`] without waking an application that sleeps on its
/// ring: [`wake_apps`] does, once for a batch.
fn queue_to_app(
    flows: &mut IdMap<PortId, Box<FlowSlot>>,
    system: &mut System,
    i: usize,
    port: PortId,
    sdu: &[u8],
) {
    let taken = match flows.get_mut(&port).map(|s| &mut **s) {
        Some(FlowSlot { rings: Some(r), .. }) => r.push(sdu),
        Some(slot) => slot
            .sock()
            .is_some_and(|fd| matches!(sys::send(fd, sdu, None), Ok(Sent::Done))),
        None => false,
    };
    if !taken {
        count_drop(system, i, port, true);
    }
}

/// Wakes the applications of `ports` that sleep on their rings, each once.
pub(super) fn wake_apps(flows: &IdMap<PortId, Box<FlowSlot>>, ports: &mut Vec<PortId>) {
    ports.sort_unstable();
    ports.dedup();
    for port in ports.drain(..) {
        if let Some(r) = flows.get(&port).and_then(|s| s.rings.as_ref()) {
            r.wake();
        }
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
    /// Receives what waits on the socket of shim-udp IPCP `i`, up to
    /// [`RX_SLOTS`](udp_batch::RX_SLOTS) reads; true if there may be more.
    pub(super) fn service_udp(&mut self, i: usize) -> bool {
        let now = self.now();
        let Io::Udp(u) = &mut self.ipcps[i].io else {
            return false;
        };
        u.rx_calls += 1;
        let fd = u.sock.as_raw_fd();
        let mut rx = std::mem::take(&mut self.udp.rx);
        let copied = rx.copied();
        let more = match rx.recv(fd) {
            Ok(n) => {
                for (from, frame) in rx.datagrams() {
                    let Some(from) = from else { continue };
                    // Each datagram in the buffer it was read into: a frame
                    // of a normal IPCP goes up in it.
                    if let Some((port, sdu)) = self.sys.receive_udp_held(now, i, from, frame) {
                        self.shim_to_app(i, port, sdu);
                    }
                }
                // What the batch set off, once: deliveries over normal
                // IPCPs reach their applications from the outputs.
                self.sys.settle(now);
                wake_apps(&self.flows, &mut self.udp.woken);
                n == udp_batch::RX_SLOTS
            }
            Err(e) => {
                debug!(ipcp = %self.ipcps[i].name, error = %e, "UDP receive error");
                true
            }
        };
        if let Io::Udp(u) = &mut self.ipcps[i].io {
            u.rx_copied += rx.copied() - copied;
        }
        self.udp.rx = rx;
        more
    }

    /// Hands SDU `sdu` of shim flow `port` of IPCP `i`, in the buffer it
    /// was read into, to its application: into its ring (woken once for
    /// the batch), or held for its socket to go out with the batch. A flow
    /// holding as much as the system lets it
    /// ([`rina_core::system::System::may_hold`]) loses it (counted in the
    /// shim's flow), as a link would.
    fn shim_to_app(&mut self, i: usize, port: PortId, sdu: PduBuf) {
        match self.flows.get(&port) {
            Some(slot) if slot.rings.is_none() => {
                let held = &slot.rx_pending;
                if !self.sys.may_hold(port, held.len(), held.bytes()) {
                    count_drop(&mut self.sys, i, port, true);
                } else {
                    self.hold_for_socket(port, sdu.into());
                }
            }
            _ => {
                queue_to_app(&mut self.flows, &mut self.sys, i, port, &sdu);
                if self.udp.woken.last() != Some(&port) {
                    self.udp.woken.push(port);
                }
            }
        }
    }

    /// Sends a datagram of shim-udp IPCP `i` (its control, or a frame of a
    /// normal IPCP above) with the others of this turn of the loop. A full
    /// socket keeps it, in order, and blocks the N-1 ports over it until
    /// the socket is writable: their PDUs wait in their RMT, where the
    /// scheduling policy decides.
    pub(super) fn udp_send(&mut self, i: usize, peer: Option<SocketAddr>, frame: PduBuf) {
        let Io::Udp(u) = &mut self.ipcps[i].io else {
            return;
        };
        let Some(to) = peer else {
            u.send_errors += 1;
            return;
        };
        if !u.stalled.is_empty() {
            u.stall(std::iter::once((to, frame)));
            return;
        }
        if u.out.is_empty() {
            self.udp.dirty.push(i);
        }
        u.out.push((to, frame));
        if u.out.len() >= BUDGET {
            self.flush_udp(i);
        }
    }

    /// Sends the frames gathered for shim-udp IPCP `i`.
    pub(super) fn flush_udp(&mut self, i: usize) {
        let Io::Udp(u) = &mut self.ipcps[i].io else {
            return;
        };
        if u.out.is_empty() {
            return;
        }
        let out = u.sender.send(u.sock.as_raw_fd(), &u.out);
        u.send_errors += out.failed as u64;
        if let Some(e) = &out.error {
            debug!(ipcp = %self.ipcps[i].name, error = %e, "UDP send failed");
        }
        let Io::Udp(u) = &mut self.ipcps[i].io else {
            return;
        };
        if !out.blocked {
            u.out.clear();
            return;
        }
        let mut rest = std::mem::take(&mut u.out);
        u.stall(rest.drain(out.sent + out.failed..));
        rest.clear();
        u.out = rest;
        self.udp_blocked(i);
    }

    /// The socket of shim-udp IPCP `i` is full: wait until it is writable,
    /// and tell the system.
    fn udp_blocked(&mut self, i: usize) {
        if let Io::Udp(u) = &mut self.ipcps[i].io {
            let _ = self.poll.registry().reregister(
                &mut u.sock,
                token(T_UDP, i),
                Interest::READABLE | Interest::WRITABLE,
            );
        }
        let now = self.now();
        self.sys.medium_blocked(now, i);
    }

    /// The socket of shim-udp IPCP `i` is writable again: send what waited,
    /// then read the parked flows and open the N-1 ports over it.
    pub(super) fn unstall(&mut self, i: usize) {
        let Io::Udp(u) = &mut self.ipcps[i].io else {
            return;
        };
        while !u.stalled.is_empty() {
            let waiting = u.stalled.make_contiguous();
            let out = u.sender.send(u.sock.as_raw_fd(), waiting);
            u.send_errors += out.failed as u64;
            u.stalled.drain(..out.sent + out.failed);
            if out.blocked {
                return;
            }
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
    /// straight on a shim-udp or shim-eth IPCP, each behind room for the
    /// header, and sends them together, the shim's header written in place.
    pub(super) fn service_shim_flow(&mut self, port: PortId) -> FlowService {
        let Some(slot) = self.flows.get(&port) else {
            return FlowService::Drained;
        };
        let Some(fd) = slot.sock() else {
            return FlowService::Drained;
        };
        self.serve_shim_batch(port, |_, room| match sys::recv(fd, room) {
            Ok(Recv::Packet(n)) if n > room.len() => Got::Drop,
            Ok(Recv::Packet(n)) => Got::Sdu(n),
            // Refused (and counted) by the machine, like any bad SDU.
            Ok(Recv::Empty) => Got::Sdu(0),
            Ok(Recv::WouldBlock) => Got::Stop(FlowService::Drained),
            Ok(Recv::Closed) => Got::Stop(FlowService::Closed),
            Err(e) => {
                debug!(port, error = %e, "flow read error");
                Got::Stop(FlowService::Closed)
            }
        })
    }

    /// Serves shim-udp or shim-eth flow `port` whose application uses
    /// rings: drains its kicks, copies up to [`BUDGET`] SDUs from its ring
    /// into the arena behind room for the header, and sends them together.
    pub(super) fn service_shim_rings(&mut self, port: PortId) -> FlowService {
        let Some(slot) = self.flows.get(&port) else {
            return FlowService::Drained;
        };
        let i = slot.ipcp;
        // SDUs written just before the application closed go first.
        let open = slot.sock().is_some_and(super::app_rings::drain_kicks);
        let mut took = false;
        let served = self.serve_shim_batch(port, |d, room| {
            let Some(r) = d.flows.get_mut(&port).and_then(|s| s.rings.as_mut()) else {
                return Got::Stop(FlowService::Drained);
            };
            let n = match r.next_from_app() {
                Ok(Some(seg)) => seg.len(),
                Ok(None) => return Got::Stop(FlowService::Drained),
                Err(e) => {
                    // The application wrote garbage: its own flow suffers.
                    debug!(port, error = %e, "garbage in a flow's ring; dropped what was published");
                    count_drop(&mut d.sys, i, port, false);
                    return Got::Stop(FlowService::Drained);
                }
            };
            let ok = n <= room.len() && r.from_app.read(n, &mut room[..n]);
            r.from_app.consume(n);
            took = true;
            if ok {
                Got::Sdu(n)
            } else {
                Got::Drop
            }
        });
        // Once for the batch: the check for a writer waiting for room
        // orders this side's stores with a full fence.
        if took {
            if let Some(r) = self.flows.get(&port).and_then(|s| s.rings.as_ref()) {
                r.took();
            }
        }
        super::app_rings::closed_once_empty(open, served, self.flows.get(&port).map(|s| &**s))
    }

    /// Takes up to [`BUDGET`] SDUs of application flow `port` on a
    /// shim-udp or shim-eth IPCP from `next` (which fills the room it is
    /// given behind the header's), and sends them together.
    fn serve_shim_batch(
        &mut self,
        port: PortId,
        mut next: impl FnMut(&mut Daemon, &mut [u8]) -> Got,
    ) -> FlowService {
        let Some(i) = self.flows.get(&port).map(|s| s.ipcp) else {
            return FlowService::Drained;
        };
        if self.medium_stalled(i) {
            self.park(i, port);
            return FlowService::Drained;
        }
        let now = self.now();
        let cap = self.buf.len() - HEADROOM;
        let mut arena = std::mem::take(&mut self.udp.arena);
        arena.resize(ARENA, 0);
        let mut frames = std::mem::take(&mut self.udp.frames);
        let (mut off, mut served) = (0, FlowService::More);
        for _ in 0..BUDGET {
            if arena.len() - off < HEADROOM + cap {
                if self.send_shim_frames(i, port, &arena, &mut frames) {
                    served = FlowService::Drained;
                    break;
                }
                off = 0;
            }
            let n = match next(self, &mut arena[off + HEADROOM..off + HEADROOM + cap]) {
                Got::Sdu(n) => n,
                Got::Drop => {
                    count_drop(&mut self.sys, i, port, false);
                    continue;
                }
                Got::Stop(end) => {
                    served = end;
                    break;
                }
            };
            match self.frame_sdu(now, port, &mut arena, off, n, &mut frames) {
                Framed::Added => off += HEADROOM + n,
                Framed::Skipped => {}
                Framed::Wait => {
                    served = FlowService::Drained;
                    break;
                }
            }
        }
        if self.send_shim_frames(i, port, &arena, &mut frames) {
            served = FlowService::Drained;
        }
        self.udp.arena = arena;
        self.udp.frames = frames;
        served
    }

    /// Sends `frames` (ranges of `arena`) of application flow `port` on
    /// shim IPCP `i`; true if the socket is full (what it did not take
    /// waits, and the flow with it).
    fn send_shim_frames(
        &mut self,
        i: usize,
        port: PortId,
        arena: &[u8],
        frames: &mut Vec<(Option<SocketAddr>, Range<usize>)>,
    ) -> bool {
        if frames.is_empty() {
            return false;
        }
        if matches!(self.ipcps[i].io, Io::Eth(_)) {
            let list: Vec<&[u8]> = frames.drain(..).map(|(_, r)| &arena[r]).collect();
            return self.send_eth_frames(i, port, &list);
        }
        let Io::Udp(u) = &mut self.ipcps[i].io else {
            frames.clear();
            return false;
        };
        let list: Vec<(SocketAddr, &[u8])> = frames
            .drain(..)
            .filter_map(|(to, r)| Some((to?, &arena[r])))
            .collect();
        let out = u.sender.send(u.sock.as_raw_fd(), &list);
        u.send_errors += out.failed as u64;
        if let Some(e) = &out.error {
            debug!(port, error = %e, "UDP send failed");
        }
        if !out.blocked {
            return false;
        }
        u.stall(list[out.sent + out.failed..].iter().copied());
        if !u.parked.contains(&port) {
            u.parked.push(port);
        }
        self.udp_blocked(i);
        true
    }

    /// Makes a frame of the SDU of flow `port` at `arena[off + HEADROOM..]`
    /// (`n` bytes): the shim's header in place in front, added to `frames`.
    fn frame_sdu(
        &mut self,
        now: Instant,
        port: PortId,
        arena: &mut [u8],
        off: usize,
        n: usize,
        frames: &mut Vec<(Option<SocketAddr>, Range<usize>)>,
    ) -> Framed {
        let sdu = &arena[off + HEADROOM..off + HEADROOM + n];
        let send = match self.sys.shim_send(now, port, sdu) {
            Ok((_, send)) => send,
            Err(FlowError::WouldBlock) => {
                let i = self.flows.get(&port).map_or(usize::MAX, |s| s.ipcp);
                count_drop(&mut self.sys, i, port, false);
                self.park(i, port);
                return Framed::Wait;
            }
            Err(e) => {
                debug!(port, error = %e, "SDU not sent");
                return Framed::Skipped;
            }
        };
        let hdr = send.header();
        let start = off + HEADROOM - hdr.len();
        arena[start..off + HEADROOM].copy_from_slice(hdr);
        // A UDP frame without a peer is dropped when sent.
        frames.push((send.peer, start..off + HEADROOM + n));
        Framed::Added
    }
}
