//! Flow bundles: many flows of one application over one socket
//! ([`rina_wire::bundle`]), so that a flow costs no descriptor.
//!
//! A bundle is a `SOCK_SEQPACKET` pair like a flow's; each packet is a
//! frame naming the flow's port. Reading: the frames of a turn go to the
//! system like a socket flow's SDUs; a frame for a flow whose window is
//! closed waits in the flow's slot (`held_back`, behind its `tx_stash`,
//! in order), and the other flows' frames and every end go on. Only
//! when [`HELD_BACK_MAX`] bytes wait so in a bundle is it no longer read
//! until a window opens ([`Bundle::held_bytes`]): the flows behind then
//! wait too, as the streams of one TCP connection do. Writing: a bundled flow's SDUs are
//! held in its slot as a socket flow's are; when the bundle's socket is
//! full the flow queues in [`Bundle::waiting`] and goes on when it is
//! writable. Ends of flows the application did not close itself go to it
//! as end frames, after the flow's SDUs.
//!
//! Once the application has closed its end (or a send to it failed), the
//! bundle is read to its end whatever waits: what it wrote before goes
//! as it would on flows of their own (frames behind a closed window wait
//! in their flows), and then its flows close, those with SDUs still to
//! send after they went or the linger ran out
//! ([`rina_core::system::System::app_closed`]). A bundle with no flows
//! closes with the control connection that opened it, and one whose
//! connection is gone closes with its last flow.
//!
//! Bundled flows are offered on shim-udp and normal IPCPs (whose SDUs
//! reach applications through the flows' held queues); shim-eth and
//! shim-hv flows are delivered straight from their media and keep
//! descriptors of their own.

use super::ipcp::Io;
use super::{token, Daemon, FlowService, FlowSlot, BUDGET, BUDGET_BYTES, T_BUNDLE};
use crate::sys::{self, Recv, Sent};
use mio::unix::SourceFd;
use mio::Interest;
use rina_core::system::{FlowError, PortId};
use rina_wire::bundle::{self as frame, Kind, HEADER};
use rina_wire::ctl::{CtlError, ErrorKind, FlowInfo, Reply};
use std::collections::VecDeque;
use std::io::IoSlice;
use std::os::fd::{AsRawFd, OwnedFd};
use tracing::{debug, info, warn};

/// Bundles one control connection may open.
pub const MAX_BUNDLES_PER_CONN: usize = 16;
/// Ends of flows waiting for a bundle whose application does not read:
/// past this, the bundle is closed with its flows.
pub const MAX_ENDS_WAITING: usize = 65_536;
/// Send buffer asked for on a bundle's socket (the kernel caps it at
/// `net.core.wmem_max`).
const BUNDLE_SNDBUF: usize = 4 << 20;
/// Pieces of an SDU (with the frame's header) gathered on the stack.
const IOV_INLINE: usize = 8;
/// Bytes of frames read from a bundle that wait behind closed windows,
/// past which the bundle is not read until one opens (while its
/// application is there; once it has left, the bundle is read to its
/// end, which its socket's buffer bounds).
pub const HELD_BACK_MAX: usize = 1 << 20;

/// A bundle of an application.
pub(super) struct Bundle {
    fd: OwnedFd,
    /// The control connection that opened it: only it puts flows in it.
    pub(super) owner: usize,
    /// Its flows now.
    flows: usize,
    /// Already in the ready queue.
    queued: bool,
    /// Its socket was full: registered for writability.
    wants_writable: bool,
    /// Flows with SDUs held that wait for room, in order.
    waiting: VecDeque<PortId>,
    /// Ends of flows to tell the application, waiting for room.
    ends: VecDeque<PortId>,
    /// Bytes of its flows' `held_back` frames (read, waiting behind closed
    /// windows).
    held_bytes: usize,
    /// Packets that were not frames, or named no flow of this bundle.
    bad_frames: u64,
    /// The application's end is closed, or a send to it failed: nothing
    /// more goes to it, and the bundle is read to its end.
    gone: bool,
}

impl Daemon {
    /// Opens a bundle for control connection `conn`: its number and the
    /// application's end.
    pub(super) fn open_bundle(&mut self, conn: usize) -> Result<(Reply, OwnedFd), CtlError> {
        let held = self.bundles.values().filter(|b| b.owner == conn).count();
        if held >= MAX_BUNDLES_PER_CONN {
            return Err(CtlError::new(
                ErrorKind::NoResources,
                format!(
                    "a control connection may open {MAX_BUNDLES_PER_CONN} bundles; this one has"
                ),
            ));
        }
        let (ours, theirs) = sys::flow_pair(BUNDLE_SNDBUF).map_err(|e| {
            CtlError::new(
                ErrorKind::NoResources,
                format!(
                    "system {} cannot open a descriptor for the bundle: {e}",
                    self.system
                ),
            )
        })?;
        let mut id = self.next_bundle;
        while self.bundles.contains_key(&id) {
            id = id.wrapping_add(1).max(1);
        }
        self.next_bundle = id.wrapping_add(1).max(1);
        self.poll
            .registry()
            .register(
                &mut SourceFd(&ours.as_raw_fd()),
                token(T_BUNDLE, id as usize),
                Interest::READABLE,
            )
            .map_err(|e| CtlError::new(ErrorKind::Internal, e.to_string()))?;
        self.bundles.insert(
            id,
            Bundle {
                fd: ours,
                owner: conn,
                flows: 0,
                queued: false,
                wants_writable: false,
                waiting: VecDeque::new(),
                ends: VecDeque::new(),
                held_bytes: 0,
                bad_frames: 0,
                gone: false,
            },
        );
        info!(bundle = id, conn, "bundle opened");
        Ok((Reply::Bundle { id }, theirs))
    }

    /// Whether connection `conn` may put flows in bundle `b`.
    pub(super) fn check_bundle_owner(&self, conn: usize, b: u32) -> Result<(), CtlError> {
        match self.bundles.get(&b) {
            Some(bundle) if bundle.owner == conn && !bundle.gone => Ok(()),
            _ => Err(CtlError::new(
                ErrorKind::InvalidRequest,
                format!("no bundle {b} of this connection (open one with open_bundle)"),
            )),
        }
    }

    /// Whether connection `conn` may put a flow of IPCP `i` in bundle `b`.
    pub(super) fn check_bundle(&self, conn: usize, b: u32, i: usize) -> Result<(), CtlError> {
        self.check_bundle_owner(conn, b)?;
        let kind = match self.ipcps[i].io {
            Io::Udp(_) | Io::Normal(_) => return Ok(()),
            Io::Eth(_) => "a shim-eth IPCP",
            Io::Hv(_) => "a shim-hv IPCP",
            Io::Removed => "an IPCP destroyed",
        };
        Err(CtlError::new(
            ErrorKind::InvalidRequest,
            format!(
                "IPCP {} is {kind}, whose flows cannot be bundled (shim-udp and normal IPCPs' can)",
                self.ipcps[i].name
            ),
        ))
    }

    /// Puts allocated flow `info` of IPCP `i`, of connection `owner`, in
    /// bundle `b` (checked with [`Daemon::check_bundle`]).
    pub(super) fn open_bundled_flow(
        &mut self,
        i: usize,
        owner: usize,
        mut info: FlowInfo,
        b: u32,
    ) -> Result<FlowInfo, CtlError> {
        self.check_bundle(owner, b, i)?;
        info.bundle = Some(b);
        let uid = self.conn_uid(owner);
        self.access.charge(uid);
        self.flows.insert(
            info.port,
            Box::new(FlowSlot::new(i, None, info.clone(), owner, uid, Some(b))),
        );
        if let Some(bundle) = self.bundles.get_mut(&b) {
            bundle.flows += 1;
        }
        self.bundled += 1;
        if let Some(c) = self.conns.get_mut(&owner) {
            c.flows += 1;
        }
        Ok(info)
    }

    /// Queues bundle `b` to be read in this turn of the loop.
    pub(super) fn mark_bundle_ready(&mut self, b: u32) {
        if let Some(bundle) = self.bundles.get_mut(&b) {
            if !bundle.queued {
                bundle.queued = true;
                self.ready_bundles.push_back(b);
            }
        }
    }

    /// Serves the bundles whose sockets are readable.
    pub(super) fn service_bundles(&mut self) {
        for _ in 0..self.ready_bundles.len() {
            let Some(b) = self.ready_bundles.pop_front() else {
                break;
            };
            let Some(bundle) = self.bundles.get_mut(&b) else {
                continue;
            };
            bundle.queued = false;
            let served = self.read_bundle(b);
            self.drain_outputs();
            match served {
                FlowService::Drained => {}
                FlowService::More => self.mark_bundle_ready(b),
                FlowService::Closed => self.close_bundle(b),
            }
        }
    }

    /// Reads up to [`BUDGET`] frames from bundle `b` (and
    /// [`BUDGET_BYTES`]): SDUs go to the system, ends close their flows.
    fn read_bundle(&mut self, b: u32) -> FlowService {
        let now = self.now();
        let mut bytes = 0;
        let mut served = FlowService::More;
        for _ in 0..BUDGET {
            let Some(bundle) = self.bundles.get_mut(&b) else {
                return FlowService::Drained;
            };
            if bundle.held_bytes >= HELD_BACK_MAX && !bundle.gone {
                // Waiting for a window; but an application that closed
                // the bundle meanwhile is seen now, and what it wrote is
                // read to the end.
                if !sys::peer_hung_up(bundle.fd.as_raw_fd()) {
                    served = FlowService::Drained;
                    break;
                }
                bundle.gone = true;
            }
            if bytes >= BUDGET_BYTES {
                break;
            }
            let n = match sys::recv(bundle.fd.as_raw_fd(), &mut self.buf) {
                Ok(Recv::Packet(n)) if n <= HEADER + frame::MAX_SDU => n,
                Ok(Recv::Packet(_)) | Ok(Recv::Empty) => {
                    self.bad_frame(b, "a packet longer than any SDU, or empty");
                    continue;
                }
                Ok(Recv::WouldBlock) => {
                    served = FlowService::Drained;
                    break;
                }
                Ok(Recv::Closed) | Err(_) => {
                    served = FlowService::Closed;
                    break;
                }
            };
            bytes += n;
            self.bundle_frame(b, n);
        }
        self.sys.settle(now);
        served
    }

    /// Counts a packet of bundle `b` that is not a frame of one of its flows.
    fn bad_frame(&mut self, b: u32, why: &str) {
        if let Some(bundle) = self.bundles.get_mut(&b) {
            bundle.bad_frames += 1;
            debug!(
                bundle = b,
                bad = bundle.bad_frames,
                why,
                "bundle frame dropped"
            );
        }
    }

    /// The frame in the first `n` bytes of the daemon's buffer, read from
    /// bundle `b`.
    fn bundle_frame(&mut self, b: u32, n: usize) {
        let (kind, port) = match frame::parse(&self.buf[..n]) {
            Ok(f) => (f.kind, f.port),
            Err(e) => return self.bad_frame(b, &e.to_string()),
        };
        let Some(slot) = self.flows.get_mut(&port).filter(|s| s.bundle == Some(b)) else {
            // Also a flow that just ended: the application wrote before it
            // read the end.
            return self.bad_frame(b, "no flow of the bundle has that port");
        };
        if kind == Kind::End {
            return self.bundled_app_closed(port);
        }
        if slot.ended || slot.app_closed {
            slot.drops_out += 1;
            return;
        }
        if slot.tx_stash.is_some() || !slot.held_back.is_empty() {
            slot.held_back.push_back(self.buf[HEADER..n].to_vec());
            if let Some(bundle) = self.bundles.get_mut(&b) {
                bundle.held_bytes += n - HEADER;
            }
            return;
        }
        let now = self.now();
        match self.sys.write_held(now, port, &self.buf[HEADER..n]) {
            Ok(()) => {}
            Err(FlowError::WouldBlock) => {
                let sdu = self.buf[HEADER..n].to_vec();
                if let Some(s) = self.flows.get_mut(&port) {
                    s.tx_stash = Some(sdu);
                }
            }
            Err(e) => {
                if let Some(s) = self.flows.get_mut(&port) {
                    s.drops_out += 1;
                }
                debug!(port, error = %e, "SDU not sent");
            }
        }
    }

    /// The application closed bundled flow `port`: what it wrote that
    /// waits for the window still goes, in the time the system gives it.
    fn bundled_app_closed(&mut self, port: PortId) {
        let Some(slot) = self.flows.get_mut(&port) else {
            return;
        };
        if slot.tx_stash.is_some() || !slot.held_back.is_empty() {
            self.linger_bundled(port);
            return;
        }
        slot.app_closed = true;
        self.close_flow(port, true);
    }

    /// Bundled flow `port`, closed by its application with SDUs still
    /// waiting for the window, stays until they went or the linger ran
    /// out ([`rina_core::system::System::app_closed`]); nobody reads it
    /// any more, so what is held for the application goes (counted).
    fn linger_bundled(&mut self, port: PortId) {
        let now = self.now();
        let Some(slot) = self.flows.get_mut(&port) else {
            return;
        };
        slot.app_closed = true;
        let n = slot.rx_pending.len();
        slot.rx_pending.clear();
        slot.drops_in += n as u64;
        *self.taken.entry(port).or_default() += n;
        self.sys.app_closed(now, port);
    }

    /// Flow `port` of bundle `b` will never take the frames that wait for
    /// it (its peer ended it): dropped, counted, and the bundle read again.
    pub(super) fn drop_held_back(&mut self, b: u32, port: PortId) {
        let Some(s) = self.flows.get_mut(&port) else {
            return;
        };
        s.drops_out += s.held_back.len() as u64;
        let freed = s.held_back.iter().map(Vec::len).sum();
        s.held_back = VecDeque::new();
        self.release_held(b, freed);
    }

    /// `freed` bytes that waited behind a window in bundle `b` went (or
    /// were dropped): it is read again if it had stopped for them.
    pub(super) fn release_held(&mut self, b: u32, freed: usize) {
        if freed == 0 {
            return;
        }
        if let Some(bundle) = self.bundles.get_mut(&b) {
            let was_full = bundle.held_bytes >= HELD_BACK_MAX;
            bundle.held_bytes = bundle.held_bytes.saturating_sub(freed);
            if was_full && bundle.held_bytes < HELD_BACK_MAX {
                self.mark_bundle_ready(b);
            }
        }
    }

    /// Bundled flow `port` is ready (writable again, or closed by its
    /// application): the frames that waited for it go, and the bundle is
    /// read again once none waits.
    pub(super) fn service_bundled_flow(&mut self, port: PortId) -> FlowService {
        let now = self.now();
        let Some(slot) = self.flows.get_mut(&port) else {
            return FlowService::Drained;
        };
        let mut freed = 0;
        while slot.tx_stash.is_none() {
            let Some(sdu) = slot.held_back.pop_front() else {
                break;
            };
            freed += sdu.len();
            match self.sys.write(now, port, &sdu) {
                Ok(()) => {}
                Err(FlowError::WouldBlock) => slot.tx_stash = Some(sdu),
                Err(_) => slot.drops_out += 1,
            }
        }
        let done = slot.tx_stash.is_none();
        let closed = done && slot.app_closed;
        if let Some(b) = slot.bundle {
            self.release_held(b, freed);
        }
        if closed {
            return FlowService::Closed;
        }
        FlowService::Drained
    }

    /// Sends the SDUs held for bundled flow `port` in its bundle, as many
    /// as the socket takes; the flow waits for room with the others while
    /// some are left.
    pub(super) fn send_bundled(&mut self, port: PortId) {
        let Some(slot) = self.flows.get_mut(&port) else {
            return;
        };
        let Some(bundle) = slot.bundle.and_then(|b| self.bundles.get_mut(&b)) else {
            return;
        };
        if bundle.gone {
            // Nobody reads: what is held goes (counted), as on a socket
            // whose reader is gone.
            let n = slot.rx_pending.len();
            slot.rx_pending.clear();
            slot.drops_in += n as u64;
            *self.taken.entry(port).or_default() += n;
            return;
        }
        if bundle.wants_writable {
            if !slot.wants_writable && !slot.rx_pending.is_empty() {
                slot.wants_writable = true;
                bundle.waiting.push_back(port);
            }
            return;
        }
        let fd = bundle.fd.as_raw_fd();
        let (mut taken, mut dropped) = (0, 0);
        let h = frame::header(Kind::Sdu, port);
        while let Some(sdu) = slot.rx_pending.front() {
            let parts = sdu.parts();
            let sent = if parts.len() < IOV_INLINE {
                // Gathered from the buffers the SDU arrived in, behind the
                // header: no copy, no allocation.
                let mut iov = [IoSlice::new(&[]); IOV_INLINE];
                iov[0] = IoSlice::new(&h);
                for (slot, p) in iov[1..].iter_mut().zip(parts) {
                    *slot = IoSlice::new(p);
                }
                sys::send_parts(fd, &iov[..=parts.len()])
            } else if parts.len() < sys::MAX_IOV {
                let iov: Vec<IoSlice> = std::iter::once(&h[..])
                    .chain(parts.iter().map(|p| &p[..]))
                    .map(IoSlice::new)
                    .collect();
                sys::send_parts(fd, &iov)
            } else {
                let mut v = h.to_vec();
                v.extend_from_slice(&sdu.to_vec());
                sys::send(fd, &v, None)
            };
            match sent {
                Ok(Sent::Done) => taken += 1,
                Ok(Sent::TooBig) => dropped += 1,
                Ok(Sent::WouldBlock) => {
                    bundle.wants_writable = true;
                    slot.wants_writable = true;
                    bundle.waiting.push_back(port);
                    let _ = self.poll.registry().reregister(
                        &mut SourceFd(&fd),
                        token(T_BUNDLE, slot.bundle.unwrap_or(0) as usize),
                        Interest::READABLE | Interest::WRITABLE,
                    );
                    break;
                }
                Ok(Sent::Closed) => {
                    // The application is gone: nothing more goes to it,
                    // and what it wrote is read to the end.
                    bundle.gone = true;
                    break;
                }
                Err(e) => {
                    debug!(port, error = %e, "SDU to a bundle not sent");
                    dropped += 1;
                }
            }
            slot.rx_pending.pop_front();
        }
        let gone = bundle.gone.then_some(slot.bundle).flatten();
        if gone.is_some() {
            dropped += slot.rx_pending.len();
            slot.rx_pending.clear();
        }
        slot.drops_in += dropped as u64;
        *self.taken.entry(port).or_default() += taken + dropped;
        if let Some(b) = gone {
            self.bundle_gone(b);
        }
    }

    /// Bundle `b`'s socket has room: the ends waiting, then the flows.
    pub(super) fn bundle_writable(&mut self, b: u32) {
        let Some(bundle) = self.bundles.get_mut(&b) else {
            return;
        };
        if !bundle.wants_writable {
            return;
        }
        bundle.wants_writable = false;
        let _ = self.poll.registry().reregister(
            &mut SourceFd(&bundle.fd.as_raw_fd()),
            token(T_BUNDLE, b as usize),
            Interest::READABLE,
        );
        while let Some(&port) = self.bundles.get(&b).and_then(|x| x.ends.front()) {
            if !self.send_end(b, port) {
                return;
            }
            if let Some(x) = self.bundles.get_mut(&b) {
                x.ends.pop_front();
            }
        }
        let waiting = self
            .bundles
            .get_mut(&b)
            .map(|x| std::mem::take(&mut x.waiting))
            .unwrap_or_default();
        let mut waiting = waiting.into_iter();
        for port in waiting.by_ref() {
            if let Some(s) = self.flows.get_mut(&port) {
                s.wants_writable = false;
            }
            self.send_bundled(port);
            self.close_if_taken(port);
            if self.bundles.get(&b).is_none_or(|x| x.wants_writable) {
                break;
            }
        }
        // Those not reached keep their turn, in front.
        if let Some(x) = self.bundles.get_mut(&b) {
            let rest: Vec<PortId> = waiting.collect();
            for port in rest.into_iter().rev() {
                x.waiting.push_front(port);
            }
        }
        self.drain_outputs();
    }

    /// Sends the end of flow `port` in bundle `b`; false if its socket is
    /// full (it then waits for room).
    fn send_end(&mut self, b: u32, port: PortId) -> bool {
        let Some(bundle) = self.bundles.get_mut(&b) else {
            return true;
        };
        match sys::send(bundle.fd.as_raw_fd(), &frame::header(Kind::End, port), None) {
            Ok(Sent::WouldBlock) => {
                bundle.wants_writable = true;
                let _ = self.poll.registry().reregister(
                    &mut SourceFd(&bundle.fd.as_raw_fd()),
                    token(T_BUNDLE, b as usize),
                    Interest::READABLE | Interest::WRITABLE,
                );
                false
            }
            Ok(Sent::Done) | Ok(Sent::TooBig) => true,
            Ok(Sent::Closed) => {
                self.bundle_gone(b);
                true
            }
            Err(e) => {
                debug!(bundle = b, port, error = %e, "end of a flow not sent to its bundle");
                true
            }
        }
    }

    /// The application of bundle `b` is gone (a send to it failed):
    /// nothing more is sent to it, and the bundle is read to its end.
    fn bundle_gone(&mut self, b: u32) {
        if let Some(bundle) = self.bundles.get_mut(&b) {
            bundle.gone = true;
            bundle.ends.clear();
            bundle.waiting.clear();
            self.mark_bundle_ready(b);
        }
    }

    /// Bundled flow `port` of bundle `b` closed; `tell_app` sends its end
    /// to the application (which did not close it itself).
    pub(super) fn bundled_flow_gone(&mut self, b: u32, port: PortId, tell_app: bool, freed: usize) {
        self.bundled = self.bundled.saturating_sub(1);
        self.release_held(b, freed);
        let Some(bundle) = self.bundles.get_mut(&b) else {
            return;
        };
        bundle.flows = bundle.flows.saturating_sub(1);
        bundle.waiting.retain(|&p| p != port);
        if tell_app && !bundle.gone {
            if bundle.ends.is_empty() && !bundle.wants_writable {
                if !self.send_end(b, port) {
                    if let Some(x) = self.bundles.get_mut(&b) {
                        x.ends.push_back(port);
                    }
                }
            } else if bundle.ends.len() < MAX_ENDS_WAITING {
                bundle.ends.push_back(port);
            } else {
                warn!(
                    bundle = b,
                    "the application does not read its bundle; closing it"
                );
                self.broken_bundles.push(b);
            }
        }
        // Nobody may put flows in it any more: it goes with its last one.
        if let Some(bundle) = self.bundles.get(&b) {
            if bundle.flows == 0 && !self.conns.contains_key(&bundle.owner) {
                self.broken_bundles.push(b);
            }
        }
    }

    /// Closes bundle `b`: its application closed it, it overflowed, or it
    /// has no flows and nobody may put any in it. Its flows close with it,
    /// those with SDUs the window holds back once they went (or the linger
    /// ran out): they are the application's last writes.
    pub(super) fn close_bundle(&mut self, b: u32) {
        let Some(bundle) = self.bundles.remove(&b) else {
            return;
        };
        let _ = self
            .poll
            .registry()
            .deregister(&mut SourceFd(&bundle.fd.as_raw_fd()));
        // What the application reads ends plainly, after what was sent.
        sys::close_quietly(&bundle.fd);
        let ports: Vec<PortId> = self
            .flows
            .iter()
            .filter(|(_, s)| s.bundle == Some(b))
            .map(|(&p, _)| p)
            .collect();
        let n = ports.len();
        for port in ports {
            let Some(s) = self.flows.get_mut(&port) else {
                continue;
            };
            if s.tx_stash.is_some() || !s.held_back.is_empty() {
                self.linger_bundled(port);
            } else {
                s.app_closed = true;
                self.close_flow(port, true);
            }
        }
        info!(
            bundle = b,
            flows = n,
            bad_frames = bundle.bad_frames,
            "bundle closed"
        );
    }

    /// Closes the bundles of control connection `conn`, which closed, that
    /// hold no flow (nobody else may put flows in them).
    pub(super) fn close_empty_bundles_of(&mut self, conn: usize) {
        let empty: Vec<u32> = self
            .bundles
            .iter()
            .filter(|(_, x)| x.owner == conn && x.flows == 0)
            .map(|(&b, _)| b)
            .collect();
        for b in empty {
            self.close_bundle(b);
        }
    }

    /// Closes the bundles found broken in this turn.
    pub(super) fn close_broken_bundles(&mut self) {
        let mut broken = std::mem::take(&mut self.broken_bundles);
        broken.sort_unstable();
        broken.dedup();
        for b in broken {
            self.close_bundle(b);
        }
    }
}
