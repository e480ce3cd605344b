//! The shared-memory data path of a flow: two rings in a memory file the
//! daemon handed over (see `rina_core::shim_hv::flow_rings`), instead of one
//! system call per SDU on the flow's socket.
//!
//! An SDU is copied into the send ring and the daemon is told only if it
//! sleeps (one-byte packet on the flow socket); a read takes the next SDU
//! from the receive ring and, only when the ring is empty, asks the daemon
//! for a doorbell: a one-byte packet on the flow socket. So the socket
//! turns readable when an SDU may be waiting or the flow closed, as a
//! flow without rings does, and poll/epoll/tokio wait on it unchanged. A
//! reader that finds the ring empty reads the doorbells already there
//! before it asks for the next, so a doorbell rung while nobody waited
//! does not leave the socket readable. A writer that finds the send ring
//! full waits on the room doorbell (a pipe). One thread may read while another
//! writes: each ring has its own lock and its own doorbell.

use crate::sock;
use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout};
#[cfg(feature = "tokio")]
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags};
use nix::sys::socket::MsgFlags;
use rina_core::shim_hv::flow_rings::{self, Setup};
use rina_core::shim_hv::ring::{Consumer, Producer, Region, RingError, Segments};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Longest a waiting side sleeps before it looks at its ring again, in case
/// a doorbell was lost (a daemon restarting, say).
const RECHECK: Duration = Duration::from_millis(50);

/// Slots of `slot` bytes that hold `bytes` (at least one).
fn slots_of(slot: u32, bytes: usize) -> u32 {
    u32::try_from(bytes.div_ceil(slot.max(1) as usize))
        .unwrap_or(u32::MAX)
        .max(1)
}

/// Why the rings could not be set up or used.
#[derive(Debug)]
pub(crate) enum RingsError {
    /// The daemon sent no setup message, or a malformed one.
    BadSetup(String),
    /// A system call failed.
    Sys(Errno),
    /// The daemon wrote garbage into the ring, or the SDU can never fit.
    Ring(RingError),
    /// The daemon closed the flow.
    Closed,
    /// The next SDU is longer than the buffer: its first bytes were copied.
    TooLarge(usize),
}

/// A shared mapping, unmapped on drop.
struct Map {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain shared memory, only accessed through
// `Region` (atomics and bounds-checked copies).
unsafe impl Send for Map {}
// SAFETY: as above.
unsafe impl Sync for Map {}

impl Drop for Map {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what `Rings::setup` mapped, once; the rings
        // using it are dropped before (field order of `Rings`).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// The two rings of a flow and their doorbells.
pub(crate) struct Rings {
    tx: Mutex<Producer>,
    rx: Mutex<Consumer>,
    /// The daemon rings it when it freed room we wait for: the read end of
    /// a pipe (checked in `setup`).
    room: OwnedFd,
    _map: Map,
    /// The memory file (kept open: a debugger or a test can find it in
    /// /proc/self/fd).
    _file: OwnedFd,
}

impl std::fmt::Debug for Rings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rings").finish_non_exhaustive()
    }
}

impl Rings {
    /// Reads the setup message the daemon sent first on flow socket
    /// `sock` (waiting at most `timeout`): the rings, or `None` if the
    /// flow is a plain socket.
    pub(crate) fn setup(
        sock: BorrowedFd<'_>,
        timeout: Duration,
    ) -> Result<Option<Rings>, RingsError> {
        if !sock::wait_readable(sock, Some(timeout)).map_err(RingsError::Sys)? {
            return Err(RingsError::BadSetup(
                "no setup message within the deadline".into(),
            ));
        }
        let mut b = [0u8; 64];
        let p = sock::recv(sock, &mut b).map_err(RingsError::Sys)?;
        let setup = Setup::decode(&b[..p.len.min(b.len())]).ok_or_else(|| {
            RingsError::BadSetup(format!("{} bytes that are not a setup message", p.len))
        })?;
        let geo = match setup {
            Setup::None => return Ok(None),
            Setup::Rings(g) => g,
        };
        let mut fds = p.fds.into_iter();
        let (Some(file), Some(room)) = (fds.next(), fds.next()) else {
            return Err(RingsError::BadSetup(if p.fds_lost {
                "the rings' descriptors were lost: the process has too many open \
                 (raise its RLIMIT_NOFILE, or allocate without rings)"
                    .into()
            } else {
                "rings announced without their two descriptors".into()
            }));
        };
        // A pipe, which reading empties: anything else (/dev/zero, a
        // regular file) could stay readable for ever, and a writer waiting
        // for room would never sleep.
        if !is_fifo(room.as_fd())? {
            return Err(RingsError::BadSetup(
                "the rings' room doorbell is not a pipe".into(),
            ));
        }
        // Resetting the doorbell must never block, whatever flags the daemon
        // gave it.
        set_nonblocking(room.as_fd())?;
        let (to_app, from_app, len) = flow_rings::layout(geo);
        // Sealed against shrinking, so that the size checked next stays:
        // a file cut short under the mapping would kill this process
        // (SIGBUS) at its next access to the rings.
        // SAFETY: fcntl on a descriptor we own; -1 (EINVAL) for a file that
        // cannot be sealed.
        let seals = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GET_SEALS) };
        if seals < 0 || seals & libc::F_SEAL_SHRINK == 0 {
            return Err(RingsError::BadSetup(
                "the ring file is not sealed against shrinking".into(),
            ));
        }
        // SAFETY: fstat on a descriptor we own.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: a valid descriptor and a stat buffer of the right type.
        if unsafe { libc::fstat(file.as_raw_fd(), &mut st) } != 0
            || (st.st_size as u64) < len as u64
        {
            return Err(RingsError::BadSetup(format!(
                "the ring file is smaller than the {len} bytes its rings need"
            )));
        }
        // SAFETY: a fresh shared mapping of `len` bytes of a file at least
        // that long, which cannot shrink; the kernel picks the address.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(RingsError::Sys(Errno::last()));
        }
        let ptr = NonNull::new(p.cast::<u8>()).ok_or(RingsError::Sys(Errno::ENOMEM))?;
        let map = Map { ptr, len };
        // SAFETY: the mapping is page-aligned, readable and writable for
        // `len` bytes and lives in `Rings` as long as the rings using it.
        let region = unsafe { Region::new(ptr, len) }.map_err(RingsError::Ring)?;
        let sub = |off, n| {
            region
                .sub(off, n)
                .ok_or_else(|| RingsError::BadSetup("ring outside the file".into()))
        };
        let rx = Consumer::new(sub(to_app, geo.ring_bytes())?, geo).map_err(RingsError::Ring)?;
        let mut tx =
            Producer::new(sub(from_app, geo.ring_bytes())?, geo).map_err(RingsError::Ring)?;
        // A flow whose daemon keeps up reuses the first pages of its ring.
        tx.set_restarts(true);
        tx.set_limit(slots_of(geo.slot_size, flow_rings::SEND_LIMIT));
        Ok(Some(Rings {
            tx: Mutex::new(tx),
            rx: Mutex::new(rx),
            room,
            _map: map,
            _file: file,
        }))
    }

    /// Puts one SDU in the send ring, waiting while it is full.
    pub(crate) fn write(&self, sock: BorrowedFd<'_>, sdu: &[u8]) -> Result<(), RingsError> {
        self.write_until(sock, sdu, None).map(|_| ())
    }

    /// Puts one SDU in the send ring, waiting until `deadline` (forever
    /// without one) while it is full; false if the deadline passed first
    /// (nothing was written). The ring is looked at once more after the
    /// deadline, not again however often the doorbell rings.
    pub(crate) fn write_until(
        &self,
        sock: BorrowedFd<'_>,
        sdu: &[u8],
        deadline: Option<Instant>,
    ) -> Result<bool, RingsError> {
        // The last look, after the deadline, was taken.
        let mut past = false;
        loop {
            let mut tx = self.tx.lock().unwrap_or_else(|e| e.into_inner());
            match tx.push(&[sdu]) {
                Ok(()) => {
                    let wake = tx.take_wakeup();
                    drop(tx);
                    if wake {
                        kick(sock)?;
                    }
                    return Ok(true);
                }
                Err(RingError::Full) if past => return Ok(false),
                Err(RingError::Full) => {
                    reset(self.room.as_fd());
                    if tx.arm(sdu.len()) {
                        drop(tx);
                        if !wait(sock, Some(self.room.as_fd()), deadline)? {
                            return Ok(false);
                        }
                    }
                    past = deadline.is_some_and(|d| Instant::now() >= d);
                }
                Err(e) => return Err(RingsError::Ring(e)),
            }
        }
    }

    /// Reserves room for an SDU of at most `max` bytes in the send ring and
    /// lets `fill` write it there, returning its length (0 sends nothing);
    /// `None`, with `fill` not called, if the ring has no room for `max`
    /// bytes now. `fill` runs with the send ring locked.
    pub(crate) fn write_in_place(
        &self,
        sock: BorrowedFd<'_>,
        max: usize,
        fill: impl FnOnce(&Segments) -> usize,
    ) -> Result<Option<usize>, RingsError> {
        let mut tx = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        let room = match tx.reserve(max) {
            Ok(r) => r,
            Err(RingError::Full) => return Ok(None),
            Err(e) => return Err(RingsError::Ring(e)),
        };
        let n = fill(&room).min(max);
        if n == 0 {
            return Ok(Some(0));
        }
        tx.commit(max, n).map_err(RingsError::Ring)?;
        let wake = tx.take_wakeup();
        drop(tx);
        if wake {
            kick(sock)?;
        }
        Ok(Some(n))
    }

    /// Lets the send ring hold at most `bytes` (whole slots, at least one;
    /// at most the ring) before writers wait; returns the bytes set.
    pub(crate) fn set_send_limit(&self, bytes: usize) -> usize {
        let mut tx = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        let slot = tx.geometry().slot_size;
        tx.set_limit(slots_of(slot, bytes));
        tx.limit() as usize * slot as usize
    }

    /// Bytes of the send ring the daemon has not taken yet (whole slots,
    /// so an upper bound of the SDU bytes in them).
    pub(crate) fn unsent_bytes(&self) -> Result<usize, RingsError> {
        let tx = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        let geo = tx.geometry();
        let free = tx.free_slots().map_err(RingsError::Ring)?;
        Ok((geo.slots - free) as usize * geo.slot_size as usize)
    }

    /// Takes the next SDU into `buf`, waiting until `deadline` (forever
    /// without one) while the receive ring is empty; `None` on timeout.
    pub(crate) fn read(
        &self,
        sock: BorrowedFd<'_>,
        buf: &mut [u8],
        deadline: Option<Instant>,
    ) -> Result<Option<usize>, RingsError> {
        let cap = buf.len();
        match self.read_in_place(sock, deadline, |sdu| copy_out(sdu, buf))? {
            Some(n) if n > cap => Err(RingsError::TooLarge(n)),
            got => Ok(got),
        }
    }

    /// Hands the next SDU to `f` where it lies in the receive ring, then
    /// releases it, waiting until `deadline` (forever without one) while
    /// the ring is empty; `None` on timeout. `f` runs with the receive
    /// ring locked.
    pub(crate) fn read_in_place<R>(
        &self,
        sock: BorrowedFd<'_>,
        deadline: Option<Instant>,
        f: impl FnOnce(&Segments) -> R,
    ) -> Result<Option<R>, RingsError> {
        let mut f = f;
        loop {
            match self.take_in_place(sock, f)? {
                Ok(r) => return Ok(Some(r)),
                Err(back) => f = back,
            }
            let rx = self.rx.lock().unwrap_or_else(|e| e.into_inner());
            // Doorbells already read are forgotten (and the end of the
            // flow found) before the next is asked for.
            drain_doorbells(sock)?;
            if rx.arm() {
                drop(rx);
                if !wait(sock, None, deadline)? {
                    return Ok(None);
                }
            }
        }
    }

    /// [`Rings::read_in_place`] without waiting: `f` comes back unused if
    /// the ring is empty.
    fn take_in_place<R, F: FnOnce(&Segments) -> R>(
        &self,
        sock: BorrowedFd<'_>,
        f: F,
    ) -> Result<Result<R, F>, RingsError> {
        let mut rx = self.rx.lock().unwrap_or_else(|e| e.into_inner());
        let seg = match rx.peek() {
            Ok(Some(s)) => s,
            Ok(None) => return Ok(Err(f)),
            Err(e) => {
                // The daemon wrote garbage: skip what it published.
                rx.resync();
                return Err(RingsError::Ring(e));
            }
        };
        let r = f(&seg);
        rx.consume(seg.len());
        let wake = rx.take_wakeup();
        drop(rx);
        if wake {
            kick(sock)?;
        }
        Ok(Ok(r))
    }

    /// Takes the next SDU into `buf` if one is in the receive ring, without
    /// asking the daemon for a doorbell when there is none (so a reader
    /// that polls the ring costs the daemon nothing). The errors of
    /// [`Rings::read`], but for `Closed`, which only a doorbell tells.
    pub(crate) fn take(
        &self,
        sock: BorrowedFd<'_>,
        buf: &mut [u8],
    ) -> Result<Option<usize>, RingsError> {
        let cap = buf.len();
        match self.take_in_place(sock, |sdu| copy_out(sdu, buf))? {
            Ok(n) if n > cap => Err(RingsError::TooLarge(n)),
            Ok(n) => Ok(Some(n)),
            Err(_) => Ok(None),
        }
    }

    /// A new descriptor to poll for room: readable when the daemon freed
    /// room a writer asked for, or the flow closed (for
    /// [`AsyncFlow`](crate::AsyncFlow)).
    #[cfg(feature = "tokio")]
    pub(crate) fn writable_fd(&self, sock: BorrowedFd<'_>) -> Result<OwnedFd, RingsError> {
        let ep = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).map_err(RingsError::Sys)?;
        ep.add(self.room.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, 0))
            .map_err(RingsError::Sys)?;
        // Only the hang-up: the doorbells on the socket are the reader's.
        ep.add(sock, EpollEvent::new(EpollFlags::EPOLLRDHUP, 1))
            .map_err(RingsError::Sys)?;
        Ok(ep.0)
    }
}

/// Copies the first bytes of SDU `sdu` into `buf` (as many as fit); the
/// SDU's length.
fn copy_out(sdu: &Segments, buf: &mut [u8]) -> usize {
    let k = sdu.len().min(buf.len());
    sdu.read_at(0, &mut buf[..k]);
    sdu.len()
}

/// Doorbells [`drain_doorbells`] reads per call.
const DRAIN_BATCH: usize = 8;

/// Reads the daemon's doorbells waiting on flow socket `sock`; `Closed` at
/// its end of file. One `recvmmsg` takes up to [`DRAIN_BATCH`], and a call
/// that finds fewer has emptied the queue: no further read to learn that
/// nothing is left.
fn drain_doorbells(sock: BorrowedFd<'_>) -> Result<(), RingsError> {
    let mut bufs = [[0u8; 16]; DRAIN_BATCH];
    loop {
        let mut iovs = bufs.each_mut().map(|b| libc::iovec {
            iov_base: b.as_mut_ptr() as *mut libc::c_void,
            iov_len: b.len(),
        });
        // SAFETY: mmsghdr is plain data; all-zero is a valid empty one.
        let mut msgs: [libc::mmsghdr; DRAIN_BATCH] = unsafe { std::mem::zeroed() };
        for (m, v) in msgs.iter_mut().zip(iovs.iter_mut()) {
            m.msg_hdr.msg_iov = v;
            m.msg_hdr.msg_iovlen = 1;
        }
        // SAFETY: every header points at one iovec over a local buffer of
        // the length it declares; no timeout.
        let n = unsafe {
            libc::recvmmsg(
                sock.as_raw_fd(),
                msgs.as_mut_ptr(),
                DRAIN_BATCH as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if n < 0 {
            match Errno::last() {
                Errno::EINTR => continue,
                Errno::EAGAIN => return Ok(()),
                Errno::ECONNRESET => return Err(RingsError::Closed),
                e => return Err(RingsError::Sys(e)),
            }
        }
        let n = n as usize;
        // The daemon rings with one byte: zero is the end of the flow.
        if msgs[..n].iter().any(|m| m.msg_len == 0) {
            return Err(RingsError::Closed);
        }
        if n < DRAIN_BATCH {
            return Ok(());
        }
    }
}

fn set_nonblocking(fd: BorrowedFd<'_>) -> Result<(), RingsError> {
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    let flags = fcntl(fd.as_raw_fd(), FcntlArg::F_GETFL).map_err(RingsError::Sys)?;
    let flags = OFlag::from_bits_truncate(flags) | OFlag::O_NONBLOCK;
    fcntl(fd.as_raw_fd(), FcntlArg::F_SETFL(flags)).map_err(RingsError::Sys)?;
    Ok(())
}

/// Whether `fd` is a pipe (or a named one).
fn is_fifo(fd: BorrowedFd<'_>) -> Result<bool, RingsError> {
    // SAFETY: stat is plain data; all-zero is a valid one.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor and a stat buffer of the right type.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(RingsError::Sys(Errno::last()));
    }
    Ok(st.st_mode & libc::S_IFMT == libc::S_IFIFO)
}

/// Reads [`reset`] makes at most: a default pipe's capacity (64 KiB) in
/// 64-byte reads, far more than the bytes an honest daemon's doorbells
/// leave there.
const RESET_READS: usize = 1024;

/// Clears the room doorbell `room`, the read end of a pipe (one byte a
/// ring; made non-blocking in `setup`): a doorbell rung while nobody
/// waited is forgotten before the next one is asked for. At most
/// [`RESET_READS`] reads, so that a daemon that keeps the pipe full
/// cannot hold a writer here.
pub(crate) fn reset(room: BorrowedFd<'_>) {
    let mut v = [0u8; 64];
    for _ in 0..RESET_READS {
        // SAFETY: reads at most 64 bytes into a local buffer; EAGAIN when
        // it is clear.
        let n = unsafe { libc::read(room.as_raw_fd(), v.as_mut_ptr().cast(), v.len()) };
        if n < v.len() as isize {
            return;
        }
    }
}

/// Tells the daemon to look at the rings (it sleeps).
fn kick(sock: BorrowedFd<'_>) -> Result<(), RingsError> {
    match sock::send_sdu(sock, &[1], MsgFlags::MSG_DONTWAIT) {
        // A full socket already holds kicks the daemon has yet to drain.
        Ok(()) | Err(Errno::EAGAIN) => Ok(()),
        Err(Errno::EPIPE) | Err(Errno::ECONNRESET) => Err(RingsError::Closed),
        Err(e) => Err(RingsError::Sys(e)),
    }
}

/// Sleeps until the daemon rings: the room doorbell if given (a writer, which
/// resets it), else the flow socket (a reader, which drains it on its next
/// look); or until the socket hangs up (the flow is closed), [`RECHECK`]
/// passes, or `deadline`. False only at the deadline, with nothing rung.
/// A deadline already past still looks once without sleeping, so a
/// non-blocking call learns that the flow closed.
fn wait(
    sock: BorrowedFd<'_>,
    room: Option<BorrowedFd<'_>>,
    deadline: Option<Instant>,
) -> Result<bool, RingsError> {
    let mut t = RECHECK;
    let mut last = false;
    if let Some(d) = deadline {
        let left = d.saturating_duration_since(Instant::now());
        last = left <= t;
        t = t.min(left);
    }
    let ms = t.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
    let timeout = PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX);
    let Some(room) = room else {
        // A reader: a doorbell or the end of file; the next look tells.
        let mut fds = [PollFd::new(sock, PollFlags::POLLIN)];
        return match nix::poll::poll(&mut fds, timeout) {
            Ok(0) => Ok(!last),
            Ok(_) | Err(Errno::EINTR) => Ok(true),
            Err(e) => Err(RingsError::Sys(e)),
        };
    };
    // A writer: the room doorbell, or the hang-up (the socket's doorbells
    // are the reader's). By libc's poll, whose `revents` can be read
    // whatever they hold: nix's gives none when they hold POLLRDHUP, which
    // it cannot name, and the hang-up went unseen (the writer polled on
    // for ever).
    let mut fds = [
        libc::pollfd {
            fd: room.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: sock.as_raw_fd(),
            events: libc::POLLRDHUP,
            revents: 0,
        },
    ];
    // SAFETY: `fds` is an array of two initialised pollfds that outlives
    // the call.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, i32::from(timeout)) };
    match n {
        0 => return Ok(!last),
        n if n < 0 => {
            return match Errno::last() {
                Errno::EINTR => Ok(true),
                e => Err(RingsError::Sys(e)),
            }
        }
        _ => {}
    }
    if fds[1].revents & (libc::POLLHUP | libc::POLLRDHUP | libc::POLLERR | libc::POLLNVAL) != 0 {
        return Err(RingsError::Closed);
    }
    if fds[0].revents & libc::POLLIN != 0 {
        reset(room);
    } else if fds[0].revents != 0 {
        // The doorbell hung up (the daemon closed its end) and will never
        // ring: wait for the socket's hang-up alone, as for a lost doorbell,
        // instead of waking at once for ever.
        let mut fds = [fds[1]];
        // SAFETY: as above, one pollfd.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 1, i32::from(timeout)) };
        if n > 0 && fds[0].revents != 0 {
            return Err(RingsError::Closed);
        }
        return Ok(!last);
    }
    Ok(true)
}
