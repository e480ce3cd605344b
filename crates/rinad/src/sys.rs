//! Thin wrappers over the Unix socket calls the daemon needs and std lacks:
//! `SOCK_SEQPACKET` listeners and socket pairs, and descriptor passing.
//! Every socket made here is non-blocking and close-on-exec.

use nix::sys::socket::{
    self, AddressFamily, Backlog, ControlMessage, MsgFlags, SockFlag, SockType, UnixAddr,
};
use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

fn io_err(e: nix::Error) -> io::Error {
    io::Error::from_raw_os_error(e as i32)
}

const FLAGS: SockFlag = SockFlag::SOCK_NONBLOCK.union(SockFlag::SOCK_CLOEXEC);

/// A listening `SOCK_SEQPACKET` socket bound at `path`.
pub fn seqpacket_listener(path: &Path) -> io::Result<OwnedFd> {
    let fd =
        socket::socket(AddressFamily::Unix, SockType::SeqPacket, FLAGS, None).map_err(io_err)?;
    let addr = UnixAddr::new(path).map_err(io_err)?;
    socket::bind(fd.as_raw_fd(), &addr).map_err(io_err)?;
    socket::listen(&fd, Backlog::new(128).map_err(io_err)?).map_err(io_err)?;
    Ok(fd)
}

/// Whether something answers on the `SOCK_SEQPACKET` socket at `path`.
pub fn seqpacket_alive(path: &Path) -> bool {
    let Ok(fd) = socket::socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    ) else {
        return false;
    };
    let Ok(addr) = UnixAddr::new(path) else {
        return false;
    };
    socket::connect(fd.as_raw_fd(), &addr).is_ok()
}

/// Accepts one connection, or `None` when there is none waiting. A
/// connection that was aborted before it was accepted is skipped.
pub fn accept(listener: &OwnedFd) -> io::Result<Option<OwnedFd>> {
    loop {
        match socket::accept4(listener.as_raw_fd(), FLAGS) {
            Ok(fd) => {
                // SAFETY: accept4 returned a fresh descriptor that nobody else owns.
                let fd = unsafe { OwnedFd::from_raw_fd(fd) };
                let _ = socket::setsockopt(&fd, socket::sockopt::SndBuf, &CTL_SNDBUF);
                return Ok(Some(fd));
            }
            Err(nix::Error::EAGAIN) => return Ok(None),
            Err(nix::Error::ECONNABORTED) | Err(nix::Error::EINTR) => continue,
            Err(e) => return Err(io_err(e)),
        }
    }
}

/// Send buffer asked for on control connections, so large listings fit one
/// packet (the kernel caps it at `net.core.wmem_max`).
const CTL_SNDBUF: usize = rina_wire::ctl::MAX_CTL_MSG;

/// Descriptors a privileged daemon asks for (bounded by the kernel's
/// `fs.nr_open`): room for 100,000 flows and more.
const WANTED_FDS: u64 = 1 << 20;

/// Raises the limit of open descriptors as far as this daemon may: every
/// flow costs it one. A daemon allowed to (`CAP_SYS_RESOURCE`) raises the
/// hard limit to [`WANTED_FDS`] (or the kernel's `fs.nr_open`); any other
/// raises its soft limit to its hard one. Returns the limit now in force.
pub fn raise_fd_limit() -> u64 {
    let nr_open = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(WANTED_FDS);
    rina::raise_fd_limit(WANTED_FDS.min(nr_open))
}

/// Hands the heap's free pages back to the system (glibc's allocator keeps
/// them otherwise).
pub fn trim_heap() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim has no preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The identity of the socket (or any open file) `fd`: its device and
/// inode, the same in every process that holds it, whatever the
/// descriptor's number.
pub fn socket_key(fd: &OwnedFd) -> Option<(u64, u64)> {
    let st = nix::sys::stat::fstat(fd.as_raw_fd()).ok()?;
    Some((st.st_dev as u64, st.st_ino as u64))
}

/// A connected pair of `SOCK_SEQPACKET` sockets: one for the daemon, one for
/// the application. Both ends get send buffers of `sndbuf` bytes where the
/// system allows.
pub fn flow_pair(sndbuf: usize) -> io::Result<(OwnedFd, OwnedFd)> {
    let (a, b) = socket::socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .map_err(io_err)?;
    for fd in [&a, &b] {
        let _ = socket::setsockopt(fd, socket::sockopt::SndBuf, &sndbuf);
    }
    // A fresh socket has no other status flag to keep: one call, not a
    // read and a write of the flags.
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    fcntl(a.as_raw_fd(), FcntlArg::F_SETFL(OFlag::O_NONBLOCK)).map_err(io_err)?;
    Ok((a, b))
}

/// Puts a descriptor in non-blocking mode (tests: the daemon never relies
/// on a flag a peer holding the same open file could clear).
#[cfg(test)]
pub fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    let flags = fcntl(fd, FcntlArg::F_GETFL).map_err(io_err)?;
    let flags = OFlag::from_bits_truncate(flags) | OFlag::O_NONBLOCK;
    fcntl(fd, FcntlArg::F_SETFL(flags)).map_err(io_err)?;
    Ok(())
}

/// Outcome of a non-blocking receive.
pub enum Recv {
    /// A packet of this many bytes (it may have been truncated if the
    /// returned length exceeds the buffer).
    Packet(usize),
    /// A packet of zero bytes (not the end of the stream).
    Empty,
    /// Nothing to read now.
    WouldBlock,
    /// The peer closed.
    Closed,
}

/// Whether the peer of a connected socket has hung up.
pub fn peer_hung_up(fd: RawFd) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: one valid pollfd, zero timeout.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    n > 0 && p.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0
}

/// Receives one packet without blocking. The returned length is the real
/// length of the packet, even when it did not fit (`MSG_TRUNC`). On a
/// `SOCK_SEQPACKET` socket a read of zero bytes is either an empty packet
/// or the end of the stream; the two are told apart by asking whether the
/// peer hung up.
///
/// A peer that closed with packets of ours left unread makes the kernel
/// report `ECONNRESET` once, ahead of the packets it sent before: that
/// report is passed over (the next read gives them, then the end), so an
/// application that writes its last SDUs and closes without reading loses
/// none of them.
pub fn recv(fd: RawFd, buf: &mut [u8]) -> io::Result<Recv> {
    let flags = MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_TRUNC;
    let got = match socket::recv(fd, buf, flags) {
        // The error is reported (and cleared) once.
        Err(nix::Error::ECONNRESET) => socket::recv(fd, buf, flags),
        got => got,
    };
    match got {
        Ok(0) if peer_hung_up(fd) => Ok(Recv::Closed),
        Ok(0) => Ok(Recv::Empty),
        Ok(n) => Ok(Recv::Packet(n)),
        Err(nix::Error::EAGAIN) => Ok(Recv::WouldBlock),
        Err(nix::Error::ECONNRESET) => Ok(Recv::Closed),
        Err(e) => Err(io_err(e)),
    }
}

/// Makes the last close of the daemon's end of a flow socket `fd` a
/// plain end of file at the application's: the kernel reports
/// `ECONNRESET` to the application's next read, ahead of the SDUs still
/// queued for it, when the end closed had packets left unread. Writes
/// are shut off first, so that none comes between the drain and the
/// close (the application's sends fail from then on), and every packet
/// left is read: the queue is bounded by the socket's buffer and cannot
/// grow, so unlike [`drain`] there is no cap, and none may be left.
pub fn close_quietly(fd: &OwnedFd) {
    let _ = socket::shutdown(fd.as_raw_fd(), socket::Shutdown::Read);
    drain_up_to(fd.as_raw_fd(), usize::MAX);
}

/// Packets [`drain`] reads per `recvmmsg`.
const DRAIN_BATCH: usize = 8;
/// `recvmmsg` calls [`drain`] makes at most.
const DRAIN_MAX_BATCHES: usize = 16;

/// Reads and drops the packets waiting on `fd` (doorbells, kicks) without
/// blocking; false if the peer closed. One `recvmmsg` takes up to
/// [`DRAIN_BATCH`] of them, and a call that finds fewer has emptied the
/// queue: no further read to learn that nothing is left. At most
/// [`DRAIN_MAX_BATCHES`] reads a call: a peer that sends as fast as they
/// are read does not hold the daemon here (what is left only says again
/// what was said; its next packet is a new readiness), and whether it hung
/// up is then asked directly.
pub fn drain(fd: RawFd) -> bool {
    drain_up_to(fd, DRAIN_MAX_BATCHES)
}

/// [`drain`] with at most `batches` reads.
fn drain_up_to(fd: RawFd, batches: usize) -> bool {
    let mut bufs = [[0u8; 16]; DRAIN_BATCH];
    for _ in 0..batches {
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
                fd,
                msgs.as_mut_ptr(),
                DRAIN_BATCH as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if n < 0 {
            match io::Error::last_os_error().raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN) => return true,
                _ => return false,
            }
        }
        let n = n as usize;
        // A read of zero bytes is an empty packet or the end of the stream.
        if msgs[..n].iter().any(|m| m.msg_len == 0) && peer_hung_up(fd) {
            return false;
        }
        if n < DRAIN_BATCH {
            return true;
        }
    }
    !peer_hung_up(fd)
}

/// Outcome of a non-blocking send.
#[derive(Debug, PartialEq, Eq)]
pub enum Sent {
    /// The whole packet was queued.
    Done,
    /// The peer's buffer is full.
    WouldBlock,
    /// The packet is larger than the socket can ever take.
    TooBig,
    /// The peer is gone.
    Closed,
}

/// Sends one packet without blocking, with an optional descriptor attached.
pub fn send(fd: RawFd, buf: &[u8], pass: Option<RawFd>) -> io::Result<Sent> {
    match pass {
        Some(f) => send_fds(fd, buf, &[f]),
        None => send_fds(fd, buf, &[]),
    }
}

/// [`send`] with any number of descriptors attached (`SCM_RIGHTS`).
pub fn send_fds(fd: RawFd, buf: &[u8], pass: &[RawFd]) -> io::Result<Sent> {
    send_iov(fd, &[IoSlice::new(buf)], pass)
}

/// Sends one packet gathered from `parts`, without blocking.
pub fn send_parts(fd: RawFd, parts: &[IoSlice<'_>]) -> io::Result<Sent> {
    send_iov(fd, parts, &[])
}

/// The most buffers one `sendmsg` gathers (Linux's `UIO_MAXIOV`).
pub const MAX_IOV: usize = 1024;

fn send_iov(fd: RawFd, iov: &[IoSlice<'_>], pass: &[RawFd]) -> io::Result<Sent> {
    let flags = MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL;
    let rights = [ControlMessage::ScmRights(pass)];
    let cmsgs: &[ControlMessage] = if pass.is_empty() { &[] } else { &rights };
    match socket::sendmsg::<()>(fd, iov, cmsgs, flags, None) {
        Ok(_) => Ok(Sent::Done),
        Err(nix::Error::EAGAIN) => Ok(Sent::WouldBlock),
        Err(nix::Error::EMSGSIZE) => Ok(Sent::TooBig),
        Err(nix::Error::EPIPE) | Err(nix::Error::ECONNRESET) => Ok(Sent::Closed),
        Err(e) => Err(io_err(e)),
    }
}

/// Who is at the other end of a control connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerCred {
    /// Its process (at connect time).
    pub pid: i32,
    /// Its effective user.
    pub uid: u32,
    /// Its effective group.
    pub gid: u32,
    /// Its supplementary groups (empty where the kernel cannot say).
    pub groups: Vec<u32>,
}

impl PeerCred {
    /// Whether this user may read a file with metadata `m` by its mode
    /// bits (owner, then group, then others; root always). The
    /// directories on the way are not looked at.
    pub fn may_read(&self, m: &std::fs::Metadata) -> bool {
        use std::os::unix::fs::MetadataExt;
        let mode = m.mode();
        if self.uid == 0 {
            true
        } else if m.uid() == self.uid {
            mode & 0o400 != 0
        } else if m.gid() == self.gid || self.groups.contains(&m.gid()) {
            mode & 0o040 != 0
        } else {
            mode & 0o004 != 0
        }
    }
}

/// The credentials of the peer of a connected Unix socket (`SO_PEERCRED`,
/// and `SO_PEERGROUPS` for the supplementary groups).
pub fn peer_cred(fd: &OwnedFd) -> io::Result<PeerCred> {
    let c = socket::getsockopt(fd, socket::sockopt::PeerCredentials).map_err(io_err)?;
    Ok(PeerCred {
        pid: c.pid(),
        uid: c.uid(),
        gid: c.gid(),
        groups: peer_groups(fd.as_raw_fd()),
    })
}

fn peer_groups(fd: RawFd) -> Vec<u32> {
    let mut groups = vec![0 as libc::gid_t; 256];
    let mut len = (groups.len() * std::mem::size_of::<libc::gid_t>()) as libc::socklen_t;
    // SAFETY: the buffer holds `len` bytes; the kernel writes at most that.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_PEERGROUPS,
            groups.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Vec::new();
    }
    groups.truncate(len as usize / std::mem::size_of::<libc::gid_t>());
    groups
}

/// The effective user of this process.
pub fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// The id of group `name` and the users listed as its members (by uid),
/// from the system's group and user databases.
pub fn group_members(name: &str) -> io::Result<(u32, Vec<u32>)> {
    let g = nix::unistd::Group::from_name(name)
        .map_err(io_err)?
        .ok_or_else(|| io::Error::other(format!("no group named {name:?}")))?;
    let uids = g
        .mem
        .iter()
        .filter_map(|m| nix::unistd::User::from_name(m).ok().flatten())
        .map(|u| u.uid.as_raw())
        .collect();
    Ok((g.gid.as_raw(), uids))
}

/// Makes sure the directory of socket `path` may hold it (see
/// `rina_wire::ctl::check_socket_dir`). With `private`, the directory is
/// created with mode 0700 when it does not exist, and must be this user's
/// own with no access for others; otherwise it must exist.
pub fn prepare_socket_dir(path: &Path, private: bool) -> Result<(), String> {
    use std::os::unix::fs::DirBuilderExt;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if private && std::fs::symlink_metadata(dir).is_err() {
        match std::fs::DirBuilder::new().mode(0o700).create(dir) {
            Ok(()) => {}
            // Someone made it meanwhile: the check below judges it.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => {
                return Err(format!(
                    "cannot create socket directory {}: {e}",
                    dir.display()
                ))
            }
        }
    }
    rina_wire::ctl::check_socket_dir(dir, euid(), private)
}

/// Gives the socket at `path` mode `mode` and, with `group`, that group.
pub fn set_socket_access(path: &Path, mode: u32, group: Option<&str>) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(g) = group {
        let gid = nix::unistd::Group::from_name(g)
            .map_err(io_err)?
            .ok_or_else(|| io::Error::other(format!("no group named {g:?}")))?
            .gid;
        nix::unistd::chown(path, None, Some(gid)).map_err(io_err)?;
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

/// 32 bytes from the operating system's random source (seeds the
/// protocol machines' nonces; the machines read no randomness themselves).
pub fn random_seed() -> io::Result<[u8; 32]> {
    use std::io::Read;
    let mut seed = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut seed)?;
    Ok(seed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> (OwnedFd, OwnedFd) {
        socket::socketpair(AddressFamily::Unix, SockType::SeqPacket, None, FLAGS).unwrap()
    }

    #[test]
    fn a_user_may_read_by_owner_then_group_then_others() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let f = std::env::temp_dir().join(format!("rinad-may-read-{}", std::process::id()));
        std::fs::write(&f, b"x").unwrap();
        let m = |mode: u32| {
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(mode)).unwrap();
            std::fs::metadata(&f).unwrap()
        };
        let owner = std::fs::metadata(&f).unwrap().uid();
        let group = std::fs::metadata(&f).unwrap().gid();
        let who = |uid: u32, gid: u32, groups: Vec<u32>| PeerCred {
            pid: 1,
            uid,
            gid,
            groups,
        };
        let (stranger, other) = (owner.wrapping_add(4242), group.wrapping_add(4242));
        // The owner's bits decide for the owner, even against the others'.
        assert!(!who(owner, group, vec![]).may_read(&m(0o044)) || owner == 0);
        assert!(who(owner, other, vec![]).may_read(&m(0o400)));
        // The group's, by the primary group or a supplementary one.
        assert!(who(stranger, group, vec![]).may_read(&m(0o040)));
        assert!(who(stranger, other, vec![group]).may_read(&m(0o040)));
        assert!(!who(stranger, group, vec![]).may_read(&m(0o604)));
        // The others'.
        assert!(who(stranger, other, vec![]).may_read(&m(0o004)));
        assert!(!who(stranger, other, vec![]).may_read(&m(0o640)));
        // Root reads anything.
        assert!(who(0, 0, vec![]).may_read(&m(0o000)));
        std::fs::remove_file(&f).unwrap();
    }

    /// The daemon closes its end of a flow with `unread` packets of the
    /// application's left in it, just after handing the application a last
    /// SDU: what the application reads next.
    fn read_after_close_quietly(unread: usize) -> Result<Vec<u8>, nix::Error> {
        let (daemon, app) = flow_pair(1 << 20).unwrap();
        set_nonblocking(app.as_raw_fd()).unwrap();
        for _ in 0..unread {
            assert_eq!(send(app.as_raw_fd(), b"x", None).unwrap(), Sent::Done);
        }
        assert_eq!(send(daemon.as_raw_fd(), b"last", None).unwrap(), Sent::Done);
        close_quietly(&daemon);
        drop(daemon);
        let mut buf = [0u8; 16];
        let n = socket::recv(app.as_raw_fd(), &mut buf, MsgFlags::MSG_DONTWAIT)?;
        Ok(buf[..n].to_vec())
    }

    /// However many packets the application left unread in the daemon's
    /// end, the SDU the daemon handed it last comes before the end of the
    /// flow. Before, `close_quietly` read 128 of them at most (the cap of
    /// [`drain`]): with 200 left, the application's next read was
    /// `ECONNRESET`, ahead of the SDU.
    #[test]
    fn close_quietly_leaves_no_reset_however_much_is_unread() {
        for unread in [0, 100, 200, 1_000] {
            assert_eq!(
                read_after_close_quietly(unread),
                Ok(b"last".to_vec()),
                "{unread} packets unread"
            );
        }
    }

    /// An application writes a last SDU and closes its end without
    /// reading what the daemon sent it: the daemon reads the SDU, then the
    /// end. Before, the kernel's one `ECONNRESET` (the application closed
    /// with packets unread) was taken for the end, ahead of the SDU, which
    /// was lost.
    #[test]
    fn recv_gives_the_last_packet_of_a_peer_that_closed_without_reading() {
        let (daemon, app) = pair();
        assert_eq!(
            send(daemon.as_raw_fd(), b"unread", None).unwrap(),
            Sent::Done
        );
        assert_eq!(send(app.as_raw_fd(), b"bye", None).unwrap(), Sent::Done);
        drop(app);
        let mut buf = [0u8; 16];
        let got = recv(daemon.as_raw_fd(), &mut buf).unwrap();
        assert!(matches!(got, Recv::Packet(3)), "not the last SDU");
        assert_eq!(&buf[..3], b"bye");
        let end = recv(daemon.as_raw_fd(), &mut buf).unwrap();
        assert!(matches!(end, Recv::Closed), "not the end");
    }

    #[test]
    fn drain_empties_the_queue_in_batches_and_finds_the_end() {
        let (a, b) = pair();
        // More kicks than one call takes, and an empty packet among them.
        for k in 0..(3 * DRAIN_BATCH + 1) {
            let kick: &[u8] = if k == 5 { b"" } else { b"\x01" };
            assert_eq!(send(a.as_raw_fd(), kick, None).unwrap(), Sent::Done);
        }
        assert!(drain(b.as_raw_fd()), "an empty packet is not the end");
        let mut buf = [0u8; 16];
        assert!(matches!(
            recv(b.as_raw_fd(), &mut buf).unwrap(),
            Recv::WouldBlock
        ));
        // Nothing waiting: still open.
        assert!(drain(b.as_raw_fd()));
        // Kicks then the end of the stream: the end is found.
        send(a.as_raw_fd(), b"\x01", None).unwrap();
        drop(a);
        assert!(!drain(b.as_raw_fd()));
    }

    /// A call reads a bounded number of kicks (a peer sending as fast could
    /// hold it for ever), and still finds a hang-up behind the rest.
    #[test]
    fn drain_reads_a_bounded_number_of_kicks_a_call() {
        let (a, b) = pair();
        let max = DRAIN_BATCH * DRAIN_MAX_BATCHES;
        let mut sent = 0;
        while sent < max + 10 && send(a.as_raw_fd(), b"\x01", None).unwrap() == Sent::Done {
            sent += 1;
        }
        assert_eq!(sent, max + 10, "the socket buffer took them all");
        assert!(drain(b.as_raw_fd()));
        let mut buf = [0u8; 16];
        let mut left = 0;
        while let Recv::Packet(_) = recv(b.as_raw_fd(), &mut buf).unwrap() {
            left += 1;
        }
        assert_eq!(left, 10, "a call read {max}");
        for _ in 0..max + 10 {
            send(a.as_raw_fd(), b"\x01", None).unwrap();
        }
        drop(a);
        assert!(!drain(b.as_raw_fd()), "the hang-up behind the kicks");
    }
}
