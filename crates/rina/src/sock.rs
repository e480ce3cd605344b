//! Thin wrappers over the `SOCK_SEQPACKET` system calls the client needs.
//!
//! Every wrapper retries on `EINTR`, sends with `MSG_NOSIGNAL` (a closed peer
//! is an `EPIPE` error, never a `SIGPIPE`) and marks received descriptors
//! close-on-exec.

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{self, ControlMessage, ControlMessageOwned, MsgFlags};
use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

/// Most descriptors accepted on one control packet; the protocol sends one.
const MAX_FDS: usize = 4;

/// One received packet.
pub(crate) struct Packet {
    /// Bytes of the packet (0 means the peer closed).
    pub len: usize,
    /// The packet was longer than the buffer; its tail was discarded.
    pub truncated: bool,
    /// Descriptors attached to it (already close-on-exec).
    pub fds: Vec<OwnedFd>,
    /// Descriptors were attached but could not all be received
    /// (`MSG_CTRUNC`: typically this process is at its descriptor limit).
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

/// Receives one packet and the descriptors attached to it.
pub(crate) fn recv(fd: BorrowedFd<'_>, buf: &mut [u8]) -> Result<Packet, Errno> {
    let mut cmsg = nix::cmsg_space!([RawFd; MAX_FDS]);
    loop {
        let mut iov = [IoSliceMut::new(buf)];
        let msg = match socket::recvmsg::<()>(
            fd.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e),
            Ok(m) => m,
        };
        let mut fds = Vec::new();
        if let Ok(cmsgs) = msg.cmsgs() {
            for c in cmsgs {
                if let ControlMessageOwned::ScmRights(raw) = c {
                    for r in raw {
                        // SAFETY: the kernel just installed this descriptor in
                        // our table for us; nothing else owns it.
                        fds.push(unsafe { OwnedFd::from_raw_fd(r) });
                    }
                }
            }
        }
        return Ok(Packet {
            len: msg.bytes,
            truncated: msg.flags.contains(MsgFlags::MSG_TRUNC),
            fds,
            fds_lost: msg.flags.contains(MsgFlags::MSG_CTRUNC),
        });
    }
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
