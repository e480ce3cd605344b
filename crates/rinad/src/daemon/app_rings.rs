//! Shared-memory rings between `rinad` and the application of one flow
//! (`Client::set_rings`; layout and setup message in
//! `rina_core::shim_hv::flow_rings`): the daemon makes the memory file and
//! a pipe (for room) and sends them as the first packet of the flow
//! socket; afterwards SDUs go through the rings, and the socket only
//! carries one-byte doorbells each way (and its end of file).

use super::held::HeldQueue;
use super::shim_hv::Mapping;
use rina_core::sdu::Sdu;
use rina_core::shim_hv::flow_rings::{self, Setup};
use rina_core::shim_hv::ring::{Consumer, Producer, RingError, Segments};
use smallvec::SmallVec;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// Shared-memory rings with the application of one flow: SDUs go from
/// its ring straight into the IPCP (for shim-hv, into the VMPI ring) and
/// back, with no system call while both sides are busy.
pub(super) struct AppRings {
    pub to_app: Producer,
    pub from_app: Consumer,
    /// The daemon's end of the flow socket: a one-byte packet on it
    /// tells the application that SDUs wait (it sleeps on them). Owned by
    /// the flow's slot, which drops it with these rings.
    sock: RawFd,
    /// Rung when room appeared for the application (it sleeps on a full
    /// ring): the write end of a pipe whose read end the application has.
    /// Not an eventfd, whose one open file the application would share: it
    /// could make it blocking and fill its counter, and the daemon's next
    /// ring would block its event loop for good. Its end of a pipe is its
    /// own, and only ours is written.
    room: OwnedFd,
    _map: Mapping,
}

impl AppRings {
    /// Sends the setup message as the first packet on flow socket `fd`:
    /// new rings if `offered`, else "no rings".
    pub(super) fn offer(fd: RawFd, offered: bool) -> io::Result<Option<AppRings>> {
        if !offered {
            send_with_fds(fd, &Setup::None.encode(), &[])?;
            return Ok(None);
        }
        let geo = flow_rings::GEOMETRY;
        let (to_off, from_off, len) = flow_rings::layout(geo);
        // SAFETY: a NUL-terminated name; a negative return is an error.
        let raw = unsafe {
            libc::memfd_create(
                c"rina-flow".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            )
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor nobody else owns.
        let file = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(raw) });
        file.set_len(len as u64)?;
        // The application gets the file writable: sealed, it can no longer
        // cut it short under the daemon's mapping (a fault there, SIGBUS,
        // would kill the daemon with every flow it serves), nor grow it.
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        // SAFETY: fcntl on a descriptor we own; a negative return is an error.
        if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) } < 0 {
            return Err(io::Error::last_os_error());
        }
        let map = Mapping::new(&file, len)?;
        let region = map.region();
        let ring = |off| {
            region
                .sub(off, geo.ring_bytes())
                .ok_or_else(|| io::Error::other("ring outside the file"))
        };
        let to_io = |e: RingError| io::Error::other(e.to_string());
        let mut to_app = Producer::new(ring(to_off)?, geo).map_err(to_io)?;
        to_app.set_restarts(true);
        let from_app = Consumer::new(ring(from_off)?, geo).map_err(to_io)?;
        // Nothing to read yet: the application's first SDU must kick us.
        from_app.arm();
        let (room_rx, room) = room_pipe()?;
        send_with_fds(
            fd,
            &Setup::Rings(geo).encode(),
            &[file.as_raw_fd(), room_rx.as_raw_fd()],
        )?;
        Ok(Some(AppRings {
            to_app,
            from_app,
            sock: fd,
            room,
            _map: map,
        }))
    }
}

/// A pipe for the room doorbell, both ends non-blocking: (read end for
/// the application, write end for the daemon).
fn room_pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: a two-descriptor array; a negative return is an error.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fresh descriptors nobody else owns.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Sends one packet with descriptors on a fresh flow socket.
fn send_with_fds(fd: RawFd, bytes: &[u8], fds: &[RawFd]) -> io::Result<()> {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
    let iov = [std::io::IoSlice::new(bytes)];
    let cmsgs = [ControlMessage::ScmRights(fds)];
    let cmsgs: &[ControlMessage<'_>] = if fds.is_empty() { &[] } else { &cmsgs };
    sendmsg::<()>(
        fd,
        &iov,
        cmsgs,
        MsgFlags::MSG_NOSIGNAL | MsgFlags::MSG_DONTWAIT,
        None,
    )
    .map(|_| ())
    .map_err(|e| io::Error::from_raw_os_error(e as i32))
}

impl AppRings {
    /// Puts one SDU in the application's receive ring without waking it
    /// (call [`AppRings::wake`] after a batch); false if it has no room.
    pub(super) fn push(&mut self, sdu: &[u8]) -> bool {
        self.to_app.push(&[sdu]).is_ok()
    }

    /// [`AppRings::push`] for an SDU that may lie in several buffers,
    /// laid end to end in one record.
    pub(super) fn push_sdu(&mut self, sdu: &Sdu) -> bool {
        match sdu.parts() {
            [one] => self.push(one),
            parts => {
                // On the stack for SDUs of up to 8 fragments (64 KiB in
                // 9,000-byte PDUs): no allocation per SDU.
                let parts: SmallVec<[&[u8]; 8]> = parts.iter().map(|p| &p[..]).collect();
                self.to_app.push(&parts).is_ok()
            }
        }
    }

    /// Wakes the application if it sleeps on its receive ring.
    pub(super) fn wake(&self) {
        if self.to_app.take_wakeup() {
            self.ring_data();
        }
    }

    /// Tells the application that SDUs wait: a one-byte packet on the flow
    /// socket. A full socket already holds doorbells it has yet to read,
    /// and a closed one has nobody to wake.
    pub(super) fn ring_data(&self) {
        use nix::sys::socket::{send, MsgFlags};
        let _ = send(
            self.sock,
            &[1],
            MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL,
        );
    }

    /// After SDUs were held for want of room: asks the application to
    /// kick when it read; true if room appeared meanwhile (try now).
    pub(super) fn want_room(&mut self, len: usize) -> bool {
        !self.to_app.arm(len)
    }

    /// The next SDU the application wrote, left in its ring (consume it
    /// with `from_app.consume`): `Ok(None)` if there is none, in which case
    /// the application is asked to kick when it writes. Garbage is dropped
    /// with everything published so far and returned.
    pub(super) fn next_from_app(&mut self) -> Result<Option<Segments>, RingError> {
        loop {
            match self.from_app.peek() {
                Ok(Some(seg)) => return Ok(Some(seg)),
                // Armed and still empty: sleep; else a record just came.
                Ok(None) if self.from_app.arm() => return Ok(None),
                Ok(None) => {}
                Err(e) => {
                    self.from_app.resync();
                    return Err(e);
                }
            }
        }
    }

    /// Hands SDUs held for the application to its ring, in order; how many
    /// went, and whether room for the next appeared meanwhile (else the
    /// application is asked to kick once it read).
    pub(super) fn deliver_held<H: Held>(&mut self, q: &mut HeldQueue<H>) -> (usize, bool) {
        let mut sent = 0;
        while let Some(sdu) = q.front() {
            if !sdu.push_to(self) {
                break;
            }
            q.pop_front();
            sent += 1;
        }
        if sent > 0 {
            self.wake();
        }
        let again = q.front().is_some_and(|f| self.want_room(f.held_len()));
        (sent, again)
    }

    /// After taking SDUs from the application's ring: wakes it if it
    /// waits for room.
    pub(super) fn took(&self) {
        if self.from_app.take_wakeup() {
            // A full pipe is already readable: that doorbell is not lost.
            // SAFETY: writes one byte from a live buffer.
            let _ = unsafe { libc::write(self.room.as_raw_fd(), [1u8].as_ptr().cast(), 1) };
        }
    }
}

/// An SDU held for the application while its ring is full: one buffer
/// (shim-hv), or a delivered [`Sdu`] still in its fragments' buffers,
/// gathered into the ring when room comes (no copy into one buffer first).
pub(super) trait Held {
    /// Its length in bytes.
    fn held_len(&self) -> usize;
    /// Puts it in `r`'s receive ring; false if there is no room.
    fn push_to(&self, r: &mut AppRings) -> bool;
}

impl Held for Vec<u8> {
    fn held_len(&self) -> usize {
        self.len()
    }
    fn push_to(&self, r: &mut AppRings) -> bool {
        r.push(self)
    }
}

impl Held for Sdu {
    fn held_len(&self) -> usize {
        self.len()
    }
    fn push_to(&self, r: &mut AppRings) -> bool {
        r.push_sdu(self)
    }
}

/// Reads and drops the application's kicks on flow socket `fd`; false if
/// it closed the flow.
pub(super) fn drain_kicks(fd: RawFd) -> bool {
    crate::sys::drain(fd)
}

/// What a turn that served flow `slot`'s send ring comes to, given
/// whether its application still holds the flow (`open`): once it has
/// closed it, the flow closes when its ring is empty and nothing waits to
/// go (an SDU held for the window keeps it, as a socket's unread SDUs do,
/// for the time the system gives it: [`rina_core::system::System::app_closed`]).
pub(super) fn closed_once_empty(
    open: bool,
    served: super::FlowService,
    slot: Option<&super::FlowSlot>,
) -> super::FlowService {
    use super::FlowService;
    match served {
        FlowService::Drained if !open && slot.is_none_or(|s| s.tx_stash.is_none()) => {
            FlowService::Closed
        }
        s => s,
    }
}
