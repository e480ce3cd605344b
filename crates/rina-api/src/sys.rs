//! The few socket calls the library makes, retried on `EINTR`.

use crate::error::{ApiError, Result};
use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{
    self, AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags, SockFlag, SockType,
    UnixAddr,
};
use nix::sys::time::TimeVal;
use rina_wire::ctl::{self, CtlError, ErrorKind};
use std::fmt;
use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

/// Most descriptors taken from one packet; the protocol sends at most one.
const MAX_FDS: usize = 4;

/// Identity of an open socket: its device and inode. Unlike the descriptor
/// number it survives `dup` and is not reused while the socket is open.
pub type Key = (u64, u64);

/// The identity of the socket behind `fd`.
pub fn key(fd: RawFd) -> Result<Key> {
    // SAFETY: fstat writes only into the buffer we pass.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: any integer is a valid argument; a bad one fails with EBADF.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(ApiError::sys(Errno::last(), format!("descriptor {fd}")));
    }
    Ok((st.st_dev, st.st_ino))
}

/// Whether `fd` is an open socket.
pub fn is_socket(fd: RawFd) -> bool {
    // SAFETY: fstat writes only into the buffer we pass.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: any integer is a valid argument; a bad one fails with EBADF.
    unsafe { libc::fstat(fd, &mut st) == 0 && st.st_mode & libc::S_IFMT == libc::S_IFSOCK }
}

/// Runs `f` (which starts a thread of the library) with every signal
/// blocked in the calling thread, so the thread it starts inherits that
/// mask and takes none of the program's signals: they go to the
/// program's own threads, as they would without the library.
pub fn with_signals_blocked<T>(f: impl FnOnce() -> T) -> T {
    // SAFETY: sigset_t is plain data, filled in by sigfillset.
    let mut all: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above; pthread_sigmask writes the old mask into it.
    let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: valid sigset_t pointers, used only during the calls.
    unsafe {
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old);
    }
    let r = f();
    // SAFETY: restores the mask saved above.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    r
}

/// Whether `fd` is non-blocking and not readable now (a read would block).
pub fn would_block(fd: RawFd) -> bool {
    // SAFETY: F_GETFL takes any integer; a bad one fails with EBADF.
    let fl = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if fl < 0 || fl & libc::O_NONBLOCK == 0 {
        return false;
    }
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, not kept past the call.
    unsafe { libc::poll(&mut p, 1, 0) == 0 }
}

/// A point in time a call gives up waiting for the daemon at, and the
/// limit it was set from (for the message).
#[derive(Debug, Clone, Copy)]
pub struct Deadline {
    at: Instant,
    limit: Duration,
}

impl Deadline {
    /// `limit` from now.
    pub fn after(limit: Duration) -> Deadline {
        Deadline {
            at: Instant::now() + limit,
            limit,
        }
    }

    /// The instant it passes.
    pub fn at(&self) -> Instant {
        self.at
    }

    /// The time left, none once it passed.
    pub fn left(&self) -> Option<Duration> {
        self.at
            .checked_duration_since(Instant::now())
            .filter(|l| !l.is_zero())
    }
}

impl fmt::Display for Deadline {
    /// The limit: "30 s", or "250 ms" when it is not whole seconds.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.limit.subsec_nanos() == 0 {
            write!(f, "{} s", self.limit.as_secs())
        } else {
            write!(f, "{} ms", self.limit.as_millis())
        }
    }
}

/// Sets `SO_SNDTIMEO` (zero: no timeout), which also bounds a blocking
/// `connect` to a Unix socket whose listener's backlog is full.
fn set_send_timeout(fd: BorrowedFd<'_>, t: Duration) -> nix::Result<()> {
    // Round up to whole microseconds so a tiny rest is not "no timeout".
    let us = t.as_nanos().div_ceil(1000);
    let secs = libc::time_t::try_from(us / 1_000_000).unwrap_or(libc::time_t::MAX);
    let tv = TimeVal::new(secs, (us % 1_000_000) as libc::suseconds_t);
    socket::setsockopt(&fd, socket::sockopt::SendTimeout, &tv)
}

/// Connects to the daemon's control socket (`$RINA_SOCKET` or the
/// default), waiting at most until `deadline` for the daemon to take the
/// connection ([`ApiError::Timeout`] past it).
///
/// A blocking connect to a Unix socket waits only while the listener's
/// backlog is full: the daemon is alive but does not accept. The kernel
/// bounds that wait by the socket's send timeout (a non-blocking connect
/// would fail with `EAGAIN` at once, and cannot be polled for), which is
/// reset once connected.
pub fn connect_daemon(deadline: &Deadline) -> Result<OwnedFd> {
    let path = ctl::default_socket_path();
    let addr = UnixAddr::new(&path).map_err(|e| {
        ApiError::Invalid(format!("bad socket path {}: {}", path.display(), e.desc()))
    })?;
    let fd = socket::socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(|e| ApiError::sys(e, "cannot create a control socket"))?;
    let timed_out = || {
        ApiError::Timeout(format!(
            "the daemon at {} did not accept the connection within {deadline} \
             (its backlog is full: it is alive but not responding)",
            path.display()
        ))
    };
    loop {
        let left = deadline.left().ok_or_else(timed_out)?;
        set_send_timeout(fd.as_fd(), left)
            .map_err(|e| ApiError::sys(e, "cannot set the control socket's send timeout"))?;
        match socket::connect(fd.as_raw_fd(), &addr) {
            Ok(()) => break,
            Err(Errno::EINTR) => continue,
            Err(Errno::EAGAIN) => return Err(timed_out()),
            Err(Errno::ENOENT | Errno::ECONNREFUSED | Errno::ENOTDIR) => {
                return Err(ApiError::Daemon(CtlError::new(
                    ErrorKind::DaemonNotRunning,
                    format!(
                        "no RINA daemon listens on {} (is rinad running? {} names another socket)",
                        path.display(),
                        ctl::SOCKET_ENV
                    ),
                )))
            }
            Err(e) => {
                return Err(ApiError::sys(
                    e,
                    format!("cannot connect to the daemon at {}", path.display()),
                ))
            }
        }
    }
    // Sends are bounded by poll ([`send_until`]); a descriptor handed to
    // the program (a RINA_F_NOWAIT allocation's) is left as it was made.
    set_send_timeout(fd.as_fd(), Duration::ZERO)
        .map_err(|e| ApiError::sys(e, "cannot reset the control socket's send timeout"))?;
    Ok(fd)
}

/// A connected pair of `SOCK_SEQPACKET` sockets, close-on-exec.
pub fn seqpacket_pair() -> Result<(OwnedFd, OwnedFd)> {
    socket::socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .map_err(|e| ApiError::sys(e, "cannot create a socket pair"))
}

/// Sends one packet with `fds` attached; `MSG_DONTWAIT` with `nonblock`.
pub fn send(fd: BorrowedFd<'_>, buf: &[u8], fds: &[RawFd], nonblock: bool) -> nix::Result<()> {
    let iov = [IoSlice::new(buf)];
    let cm = [ControlMessage::ScmRights(fds)];
    let cmsgs: &[ControlMessage<'_>] = if fds.is_empty() { &[] } else { &cm };
    let mut flags = MsgFlags::MSG_NOSIGNAL;
    if nonblock {
        flags |= MsgFlags::MSG_DONTWAIT;
    }
    loop {
        match socket::sendmsg::<()>(fd.as_raw_fd(), &iov, cmsgs, flags, None) {
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e),
            Ok(_) => return Ok(()),
        }
    }
}

/// Sends one packet with `fds` attached, waiting for room in the socket
/// at most until `deadline`: false if it passed first (nothing was sent).
/// A daemon that stops reading its connection cannot block the call for
/// ever.
pub fn send_until(
    fd: BorrowedFd<'_>,
    buf: &[u8],
    fds: &[RawFd],
    deadline: &Deadline,
) -> nix::Result<bool> {
    loop {
        match send(fd, buf, fds, true) {
            Err(Errno::EAGAIN) => {
                if deadline.left().is_none() || !wait_for(fd, PollFlags::POLLOUT, deadline.at())? {
                    return Ok(false);
                }
            }
            r => return r.map(|()| true),
        }
    }
}

/// One received packet.
pub struct Packet {
    /// Its length (0: the peer closed).
    pub len: usize,
    /// It was longer than the buffer.
    pub truncated: bool,
    /// The descriptors that came with it.
    pub fds: Vec<OwnedFd>,
}

/// Receives one packet and its descriptors (close-on-exec with `cloexec`),
/// retried on `EINTR`.
pub fn recv(fd: BorrowedFd<'_>, buf: &mut [u8], cloexec: bool) -> nix::Result<Packet> {
    loop {
        match recv_interruptible(fd, buf, cloexec) {
            Err(Errno::EINTR) => continue,
            r => return r,
        }
    }
}

/// [`recv`] that fails with `EINTR` when a signal handler installed
/// without `SA_RESTART` interrupts it, as a blocking read(2) does.
pub fn recv_interruptible(
    fd: BorrowedFd<'_>,
    buf: &mut [u8],
    cloexec: bool,
) -> nix::Result<Packet> {
    let mut cmsg = nix::cmsg_space!([RawFd; MAX_FDS]);
    let flags = if cloexec {
        MsgFlags::MSG_CMSG_CLOEXEC
    } else {
        MsgFlags::empty()
    };
    let mut iov = [IoSliceMut::new(buf)];
    let msg = socket::recvmsg::<()>(fd.as_raw_fd(), &mut iov, Some(&mut cmsg), flags)?;
    let mut fds = Vec::new();
    if let Ok(cmsgs) = msg.cmsgs() {
        for c in cmsgs {
            if let ControlMessageOwned::ScmRights(raw) = c {
                // SAFETY: the kernel just installed these descriptors for
                // us; nothing else owns them.
                fds.extend(raw.into_iter().map(|r| unsafe { OwnedFd::from_raw_fd(r) }));
            }
        }
    }
    Ok(Packet {
        len: msg.bytes,
        truncated: msg.flags.contains(MsgFlags::MSG_TRUNC),
        fds,
    })
}

/// For each of the connected sockets `fds`, whether its other end is
/// closed (one `poll` for them all; none if it fails).
pub fn peers_closed<'a>(fds: impl Iterator<Item = BorrowedFd<'a>>) -> Vec<bool> {
    let mut polled: Vec<PollFd<'a>> = fds.map(|f| PollFd::new(f, PollFlags::empty())).collect();
    if polled.is_empty() {
        return Vec::new();
    }
    let n = polled.len();
    match nix::poll::poll(&mut polled, PollTimeout::ZERO) {
        Ok(k) if k > 0 => polled
            .iter()
            .map(|p| {
                p.revents()
                    .is_some_and(|r| r.intersects(PollFlags::POLLHUP | PollFlags::POLLERR))
            })
            .collect(),
        _ => vec![false; n],
    }
}

/// Waits until `fd` is readable or hung up, at most until `deadline`;
/// false if the deadline came first.
pub fn wait_readable(fd: BorrowedFd<'_>, deadline: Instant) -> nix::Result<bool> {
    wait_for(fd, PollFlags::POLLIN, deadline)
}

/// Waits until `fd` has one of `events` (or is hung up), at most until
/// `deadline`; false if the deadline came first.
fn wait_for(fd: BorrowedFd<'_>, events: PollFlags, deadline: Instant) -> nix::Result<bool> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let ms = left.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
        let t = PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX);
        let mut fds = [PollFd::new(fd.as_fd(), events)];
        match nix::poll::poll(&mut fds, t) {
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e),
            Ok(0) if Instant::now() < deadline => continue,
            Ok(0) => return Ok(false),
            Ok(_) => return Ok(true),
        }
    }
}
