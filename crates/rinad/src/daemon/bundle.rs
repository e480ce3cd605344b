//! Flow bundles: many flows of one application over one socket
//! ([`rina_wire::bundle`]), so that a flow costs no descriptor.
//!
//! A bundle is a `SOCK_SEQPACKET` pair like a flow's; each packet is a
//! frame naming the flow's port. Reading: the frames of a turn go to the
//! system like a socket flow's SDUs; a frame for a flow whose window is
//! closed waits in [`Bundle::blocked`], and the bundle is not read until
//! that flow is writable (its SDUs keep their order, the other flows
//! wait behind it). Writing: a bundled flow's SDUs are held in its slot as
//! a socket flow's are; when the bundle's socket is full the flow queues
//! in [`Bundle::waiting`] and goes on when it is writable. Ends of flows
//! the application did not close itself go to it as end frames, after
//! the flow's SDUs.
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
    /// A frame read for a flow that could not take it: the bundle is read
    /// again once that flow took it.
    blocked: Option<(PortId, Vec<u8>)>,
    /// Packets that were not frames, or named no flow of this bundle.
    bad_frames: u64,
    /// Its socket failed or its ends overflowed: closed at the end of the turn.
    broken: bool,
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
        let id = self.next_bundle;
        self.next_bundle = self.next_bundle.wrapping_add(1).max(1);
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
                blocked: None,
                bad_frames: 0,
                broken: false,
            },
        );
        info!(bundle = id, conn, "bundle opened");
        Ok((Reply::Bundle { id }, theirs))
    }

    /// Whether connection `conn` may put a flow of IPCP `i` in bundle `b`.
    pub(super) fn check_bundle(&self, conn: usize, b: u32, i: usize) -> Result<(), CtlError> {
        match self.bundles.get(&b) {
            Some(bundle) if bundle.owner == conn && !bundle.broken => {}
            _ => {
                return Err(CtlError::new(
                    ErrorKind::InvalidRequest,
                    format!("no bundle {b} of this connection (open one with open_bundle)"),
                ))
            }
        }
        match self.ipcps[i].io {
            Io::Udp(_) | Io::Normal(_) => Ok(()),
            _ => Err(CtlError::new(
                ErrorKind::InvalidRequest,
                format!(
                    "IPCP {} is a {} shim, whose flows cannot be bundled (shim-udp and normal IPCPs' can)",
                    self.ipcps[i].name,
                    if matches!(self.ipcps[i].io, Io::Eth(_)) { "shim-eth" } else { "shim-hv" }
                ),
            )),
        }
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
        if let Some(c) = self.conns.get_mut(&owner) {
            c.flows += 1;
        }
        Ok(info)
    }

    pub(super) fn mark_bundle_ready(&mut self, b: u32) {
        if let Some(bundle) = self.bundles.get_mut(&b) {
            if !bundle.queued && bundle.blocked.is_none() {
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
            let Some(bundle) = self.bundles.get(&b) else {
                return FlowService::Drained;
            };
            if bundle.blocked.is_some() || bytes >= BUDGET_BYTES {
                served = FlowService::Drained;
                break;
            }
            let n = match sys::recv(bundle.fd.as_raw_fd(), &mut self.buf) {
                Ok(Recv::Packet(n)) if n <= self.buf.len() => n,
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
        if slot.tx_stash.is_some() {
            let sdu = self.buf[HEADER..n].to_vec();
            if let Some(bundle) = self.bundles.get_mut(&b) {
                bundle.blocked = Some((port, sdu));
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
        slot.app_closed = true;
        if slot.tx_stash.is_some() {
            let now = self.now();
            self.sys.app_closed(now, port);
            return;
        }
        self.close_flow(port, true);
    }

    /// Flow `port` of bundle `b` will never take the frame that waits for
    /// it (its peer ended it): dropped, counted, and the bundle read again.
    pub(super) fn drop_blocked_frame(&mut self, b: u32, port: PortId) {
        let Some(bundle) = self.bundles.get_mut(&b) else {
            return;
        };
        if bundle.blocked.as_ref().is_some_and(|(p, _)| *p == port) {
            bundle.blocked = None;
            if let Some(s) = self.flows.get_mut(&port) {
                s.drops_out += 1;
            }
            self.mark_bundle_ready(b);
        }
    }

    /// Bundled flow `port` is ready (writable again, or closed by its
    /// application): a frame that waited for it goes, and the bundle is
    /// read again.
    pub(super) fn service_bundled_flow(&mut self, port: PortId) -> FlowService {
        let Some(slot) = self.flows.get(&port) else {
            return FlowService::Drained;
        };
        if slot.tx_stash.is_some() {
            return FlowService::Drained;
        }
        if slot.app_closed {
            return FlowService::Closed;
        }
        let Some(b) = slot.bundle else {
            return FlowService::Drained;
        };
        let waited = match self.bundles.get_mut(&b) {
            Some(bundle) if bundle.blocked.as_ref().is_some_and(|(p, _)| *p == port) => {
                bundle.blocked.take()
            }
            _ => None,
        };
        let Some((_, sdu)) = waited else {
            return FlowService::Drained;
        };
        let now = self.now();
        match self.sys.write(now, port, &sdu) {
            Ok(()) => {}
            Err(FlowError::WouldBlock) => {
                if let Some(s) = self.flows.get_mut(&port) {
                    s.tx_stash = Some(sdu);
                }
            }
            Err(_) => {
                if let Some(s) = self.flows.get_mut(&port) {
                    s.drops_out += 1;
                }
            }
        }
        self.mark_bundle_ready(b);
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
        if bundle.wants_writable || bundle.broken {
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
                Ok(Sent::Closed) | Err(_) => {
                    // The application is gone: the bundle closes with its
                    // flows at the end of the turn.
                    bundle.broken = true;
                    break;
                }
            }
            slot.rx_pending.pop_front();
        }
        if bundle.broken {
            dropped += slot.rx_pending.len();
            slot.rx_pending.clear();
            let b = slot.bundle.unwrap_or(0);
            if !self.broken_bundles.contains(&b) {
                self.broken_bundles.push(b);
            }
        }
        slot.drops_in += dropped as u64;
        *self.taken.entry(port).or_default() += taken + dropped;
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
            Ok(_) => true,
            Err(_) => {
                bundle.broken = true;
                if !self.broken_bundles.contains(&b) {
                    self.broken_bundles.push(b);
                }
                true
            }
        }
    }

    /// Bundled flow `port` of bundle `b` closed; `tell_app` sends its end
    /// to the application (which did not close it itself).
    pub(super) fn bundled_flow_gone(&mut self, b: u32, port: PortId, tell_app: bool) {
        let Some(bundle) = self.bundles.get_mut(&b) else {
            return;
        };
        bundle.flows = bundle.flows.saturating_sub(1);
        bundle.waiting.retain(|&p| p != port);
        let unblocked = bundle.blocked.as_ref().is_some_and(|(p, _)| *p == port);
        if unblocked {
            bundle.blocked = None;
        }
        if tell_app && !bundle.broken {
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
                bundle.broken = true;
                self.broken_bundles.push(b);
            }
        }
        if unblocked {
            self.mark_bundle_ready(b);
        }
    }

    /// Closes bundle `b` and every flow in it (its application closed it,
    /// or it broke).
    pub(super) fn close_bundle(&mut self, b: u32) {
        let Some(bundle) = self.bundles.get_mut(&b) else {
            return;
        };
        bundle.broken = true;
        let ports: Vec<PortId> = self
            .flows
            .iter()
            .filter(|(_, s)| s.bundle == Some(b))
            .map(|(&p, _)| p)
            .collect();
        let n = ports.len();
        for port in ports {
            if let Some(s) = self.flows.get_mut(&port) {
                s.app_closed = true;
            }
            self.close_flow(port, true);
        }
        if let Some(bundle) = self.bundles.remove(&b) {
            let _ = self
                .poll
                .registry()
                .deregister(&mut SourceFd(&bundle.fd.as_raw_fd()));
            info!(
                bundle = b,
                flows = n,
                bad_frames = bundle.bad_frames,
                "bundle closed"
            );
        }
    }

    /// Closes the bundles that broke in this turn.
    pub(super) fn close_broken_bundles(&mut self) {
        for b in std::mem::take(&mut self.broken_bundles) {
            self.close_bundle(b);
        }
    }
}
