//! Thin wrappers over the `SOCK_SEQPACKET` system calls the client needs.
//!
//! Every wrapper retries on `EINTR`, sends with `MSG_NOSIGNAL` (a closed peer
//! is an `EPIPE` error, never a `SIGPIPE`) and marks received descriptors
//! close-on-exec.

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{self, ControlMessage, MsgFlags};
use std::io::IoSlice;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

/// Most descriptors accepted on one received packet: the protocol attaches
/// two at most (a direct flow's socket and lifeline), so a packet that
/// loses some of those lost them to the descriptor limit, not to this
/// room. The kernel closes those past it.
pub(crate) const MAX_FDS: usize = 8;

/// Bytes of control buffer for [`MAX_FDS`] descriptors.
// SAFETY: CMSG_SPACE is plain arithmetic.
const CMSG_BYTES: usize =
    unsafe { libc::CMSG_SPACE((MAX_FDS * size_of::<RawFd>()) as u32) } as usize;

/// One received packet.
pub(crate) struct Packet {
    /// Bytes of the packet (0 means the peer closed).
    pub len: usize,
    /// The packet was longer than the buffer; its tail was discarded.
    pub truncated: bool,
    /// Descriptors attached to it (already close-on-exec).
    pub fds: Vec<OwnedFd>,
    /// Descriptors were attached but could not all be received
    /// (`MSG_CTRUNC`: typically this process is at its descriptor limit, or
    /// the packet carried more than [`MAX_FDS`]); those that were are in
    /// `fds`, in the order they were sent.
    pub fds_lost: bool,
}

/// Sends one packet, with `fds` attached as `SCM_RIGHTS` if any.
pub(crate) fn send(fd: BorrowedFd<'_>, buf: &[u8], fds: &[RawFd]) -> Result<(), Errno> {
    let iov = [IoSlice::new(buf)];
    let cmsgs = [ControlMessage::ScmRights(fds)];
    let cmsgs: &[ControlMessage<'_>] = if fds.is_empty() { &[] } else { &cmsgs };
    loop {
        match socket::sendmsg::<()>(fd.as_raw_fd(), &iov, cmsgs, MsgFlags::MSG_NOSIGNAL, None) {
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e),
            Ok(_) => return Ok(()),
        }
    }
}

/// Sends one packet without descriptors, waiting at most until `deadline`
/// (forever without one) for room in the socket buffer. Returns false if the
/// deadline passed first (nothing was sent).
pub(crate) fn send_until(
    fd: BorrowedFd<'_>,
    buf: &[u8],
    deadline: Option<Instant>,
) -> Result<bool, Errno> {
    let Some(deadline) = deadline else {
        send(fd, buf, &[])?;
        return Ok(true);
    };
    loop {
        match socket::send(
            fd.as_raw_fd(),
            buf,
            MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL,
        ) {
            Err(Errno::EINTR) => continue,
            Err(Errno::EAGAIN) => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() || !wait(fd, PollFlags::POLLOUT, Some(left))? {
                    return Ok(false);
                }
            }
            Err(e) => return Err(e),
            Ok(_) => return Ok(true),
        }
    }
}

/// Sets `SO_SNDTIMEO` (zero: no timeout), which also bounds a blocking
/// `connect` to a Unix socket whose listener's backlog is full.
pub(crate) fn set_send_timeout(fd: BorrowedFd<'_>, t: Duration) -> Result<(), Errno> {
    // Round up to whole microseconds so a tiny rest is not "no timeout".
    let us = t.as_nanos().div_ceil(1000);
    let secs = libc::time_t::try_from(us / 1_000_000).unwrap_or(libc::time_t::MAX);
    let tv = nix::sys::time::TimeVal::new(secs, (us % 1_000_000) as libc::suseconds_t);
    socket::setsockopt(&fd, socket::sockopt::SendTimeout, &tv)
}

/// Sends one packet without descriptors (the data path).
pub(crate) fn send_sdu(fd: BorrowedFd<'_>, buf: &[u8], flags: MsgFlags) -> Result<(), Errno> {
    loop {
        match socket::send(fd.as_raw_fd(), buf, flags | MsgFlags::MSG_NOSIGNAL) {
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e),
            Ok(_) => return Ok(()),
        }
    }
}

/// Receives one packet without descriptors (the data path). Returns the
/// packet's real length, which may exceed `buf.len()` if it was truncated.
pub(crate) fn recv_sdu(
    fd: BorrowedFd<'_>,
    buf: &mut [u8],
    flags: MsgFlags,
) -> Result<usize, Errno> {
    loop {
        match socket::recv(fd.as_raw_fd(), buf, flags | MsgFlags::MSG_TRUNC) {
            Err(Errno::EINTR) => continue,
            r => return r,
        }
    }
}

/// Receives one packet and the descriptors attached to it: every one the
/// kernel installed here is owned by the [`Packet`], even when some could
/// not be (nix's `cmsgs` refuses to walk a truncated control buffer, and
/// the descriptors in it were left open for good).
pub(crate) fn recv(fd: BorrowedFd<'_>, buf: &mut [u8]) -> Result<Packet, Errno> {
    // Aligned for `cmsghdr`.
    let mut control = [0u64; CMSG_BYTES.div_ceil(8)];
    loop {
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        // SAFETY: msghdr is plain data; all-zero is a valid empty one.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&control) as _;
        // SAFETY: the header points at one iovec over `buf` and at the
        // control buffer, both of the lengths it declares.
        let n = unsafe { libc::recvmsg(fd.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n < 0 {
            match Errno::last() {
                Errno::EINTR => continue,
                e => return Err(e),
            }
        }
        // Taken before anything can fail, so that none is left unowned.
        let fds = take_fds(&msg);
        return Ok(Packet {
            len: n as usize,
            truncated: msg.msg_flags & libc::MSG_TRUNC != 0,
            fds,
            fds_lost: msg.msg_flags & libc::MSG_CTRUNC != 0,
        });
    }
}

/// The descriptors of the `SCM_RIGHTS` messages in the control buffer of
/// `msg`, as `recvmsg` filled it in (`msg_controllen` the bytes it wrote,
/// truncated or not).
fn take_fds(msg: &libc::msghdr) -> Vec<OwnedFd> {
    let mut fds = Vec::new();
    // `msg_controllen` is a `size_t` with glibc, a `socklen_t` with musl.
    #[allow(clippy::unnecessary_cast)]
    let end = msg.msg_control as usize + msg.msg_controllen as usize;
    // SAFETY: `msg` is the header recvmsg just filled in: its control
    // buffer holds `msg_controllen` bytes, and CMSG_FIRSTHDR/CMSG_NXTHDR
    // only return headers that lie whole within them.
    let mut c = unsafe { libc::CMSG_FIRSTHDR(msg) };
    while !c.is_null() {
        // SAFETY: a header within the buffer (above), aligned by the kernel.
        let h = unsafe { &*c };
        if h.cmsg_level == libc::SOL_SOCKET && h.cmsg_type == libc::SCM_RIGHTS {
            // SAFETY: the data follows the header, within the message.
            let data = unsafe { libc::CMSG_DATA(c) };
            // SAFETY: plain arithmetic.
            let head = unsafe { libc::CMSG_LEN(0) } as usize;
            // The data the header declares, cut at the end of the buffer.
            let len = (h.cmsg_len as usize)
                .saturating_sub(head)
                .min(end.saturating_sub(data as usize));
            for i in 0..len / size_of::<RawFd>() {
                // SAFETY: within the data (above); may be unaligned.
                let raw = unsafe { data.cast::<RawFd>().add(i).read_unaligned() };
                // SAFETY: the kernel just installed this descriptor in our
                // table for us; nothing else owns it.
                fds.push(unsafe { OwnedFd::from_raw_fd(raw) });
            }
        }
        // SAFETY: as for CMSG_FIRSTHDR.
        c = unsafe { libc::CMSG_NXTHDR(msg, c) };
    }
    fds
}

/// Waits until `fd` is readable (or hung up). `None` waits forever. Returns
/// false on timeout.
pub(crate) fn wait_readable(fd: BorrowedFd<'_>, timeout: Option<Duration>) -> Result<bool, Errno> {
    wait(fd, PollFlags::POLLIN, timeout)
}

fn wait(fd: BorrowedFd<'_>, events: PollFlags, timeout: Option<Duration>) -> Result<bool, Errno> {
    // A timeout too far away to represent is no timeout.
    let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
    loop {
        let t = match deadline {
            None => PollTimeout::NONE,
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                // Round up so a sub-millisecond wait does not spin.
                let ms = left.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
                PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX)
            }
        };
        let mut fds = [PollFd::new(fd, events)];
        match nix::poll::poll(&mut fds, t) {
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e),
            Ok(0) => {
                if deadline.is_some_and(|d| Instant::now() < d) {
                    continue;
                }
                return Ok(false);
            }
            Ok(_) => return Ok(true),
        }
    }
}
