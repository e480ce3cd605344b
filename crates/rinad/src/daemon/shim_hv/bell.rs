//! The doorbells of a shim-hv device: a Unix connection between the two
//! daemons (the host listens at `PATH.bell`), each end its own daemon's,
//! on which a doorbell is a one-byte packet.

use super::*;

/// Interval between two attempts of the guest side to reach the host's
/// doorbell socket.
const BELL_RETRY: Duration = Duration::from_millis(200);

/// The hello each side of the doorbell connection sends first. (Version 1
/// carried an eventfd; a daemon of that version and this one poll.)
const BELL_HELLO: &[u8; 8] = b"RINAHVB2";

/// Most doorbells read from the connection at once (a peer that keeps
/// sending them cannot hold the daemon there).
const BELL_DRAIN_MAX: usize = 64;

/// Most descriptors one Unix message carries (Linux's `SCM_MAX_FD`).
const SCM_MAX_FD: usize = 253;

/// The doorbells of one device: a Unix connection between both daemons,
/// each end its own daemon's; a doorbell is a one-byte packet on it.
pub(super) struct Bell {
    /// Where the host side listens (`PATH.bell`).
    pub(super) sock_path: PathBuf,
    /// Whether `conn` is in the poller (its readiness is the IPCP's).
    pub(super) registered: bool,
    /// The host's listening socket.
    pub(super) listener: Option<OwnedFd>,
    /// The connection; its hang-up says the peer left.
    pub(super) conn: Option<OwnedFd>,
    /// Whether our hello went out on `conn`.
    pub(super) sent: bool,
    /// Whether the peer's hello came: doorbells are on.
    pub(super) peer: bool,
    /// When the guest side next tries to connect.
    pub(super) retry_at: Instant,
    /// Times we rang the peer.
    pub(super) rung: u64,
    /// Times our doorbell woke us.
    pub(super) wakeups: u64,
    /// Exchanges that failed (bad message, no descriptor).
    pub(super) errors: u64,
}

/// Reads the doorbells waiting on `conn` (at most [`BELL_DRAIN_MAX`]),
/// never blocking whatever its flags: how many there were.
pub(super) fn drain_bell(conn: &OwnedFd) -> usize {
    let mut buf = [0u8; 16];
    let mut n = 0;
    while n < BELL_DRAIN_MAX {
        match nix::sys::socket::recv(
            conn.as_raw_fd(),
            &mut buf,
            nix::sys::socket::MsgFlags::MSG_DONTWAIT,
        ) {
            // 0: a closed connection (or an empty packet); step notices.
            Ok(len) if len > 0 => n += 1,
            _ => break,
        }
    }
    n
}

/// Receives the peer's hello, without blocking: `Ok(false)` if nothing
/// came yet; an error for a message that is not one (descriptors it
/// carries are closed: none is taken from the peer), or a closed
/// connection.
pub(super) fn recv_bell(conn: &OwnedFd) -> io::Result<bool> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    let mut buf = [0u8; 16];
    let mut iov = [std::io::IoSliceMut::new(&mut buf)];
    // Room for as many descriptors as one message can carry (the kernel's
    // SCM_MAX_FD), so that none is installed here without being seen and
    // closed: with less room, the kernel installs what fits and the
    // message comes back truncated, which `cmsgs` refuses to walk.
    let mut space = nix::cmsg_space!([RawFd; SCM_MAX_FD]);
    let msg = match recvmsg::<()>(
        conn.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_CMSG_CLOEXEC,
    ) {
        Ok(m) => m,
        Err(nix::Error::EAGAIN) => return Ok(false),
        Err(e) => return Err(io::Error::from_raw_os_error(e as i32)),
    };
    let mut fds = 0;
    for c in msg
        .cmsgs()
        .map_err(|e| io::Error::from_raw_os_error(e as i32))?
    {
        if let ControlMessageOwned::ScmRights(v) = c {
            for f in v {
                // SAFETY: the kernel installed it for us; closed at once.
                drop(unsafe { OwnedFd::from_raw_fd(f) });
                fds += 1;
            }
        }
    }
    let n = msg.bytes;
    if n == 0 {
        return Err(io::Error::other("the doorbell connection closed"));
    }
    if n != BELL_HELLO.len() || buf[..n] != BELL_HELLO[..] || fds != 0 {
        return Err(io::Error::other(
            "not a doorbell hello (an older daemon's sends an eventfd)",
        ));
    }
    Ok(true)
}

impl Bell {
    pub(super) fn new(path: &Path, side: Side, ipcp: &str) -> Bell {
        let mut sock_path = path.as_os_str().to_owned();
        sock_path.push(".bell");
        let sock_path = PathBuf::from(sock_path);
        let listener = if side == Side::Host {
            let _ = std::fs::remove_file(&sock_path);
            match sys::seqpacket_listener(&sock_path).and_then(|l| {
                restrict_bell(path, &sock_path)?;
                Ok(l)
            }) {
                Ok(l) => Some(l),
                Err(e) => {
                    info!(ipcp, path = %sock_path.display(), error = %e, "no doorbell socket: shim-hv polls its rings");
                    None
                }
            }
        } else {
            None
        };
        Bell {
            sock_path,
            registered: false,
            listener,
            conn: None,
            sent: false,
            peer: false,
            retry_at: Instant::from_nanos(0),
            rung: 0,
            wakeups: 0,
            errors: 0,
        }
    }

    /// Whether both ends said hello.
    pub(super) fn on(&self) -> bool {
        self.peer && self.conn.is_some()
    }

    /// Rings the peer (if doorbells are on): one packet, never blocking
    /// (a full connection already holds doorbells the peer has yet to read).
    pub(super) fn ring(&mut self) {
        if !self.peer {
            return;
        }
        if let Some(c) = &self.conn {
            if let Ok(Sent::Done) = sys::send(c.as_raw_fd(), b"!", None) {
                self.rung += 1;
            }
        }
    }

    /// Reads the doorbells that woke us: how many.
    pub(super) fn drain(&mut self) -> usize {
        match &self.conn {
            Some(c) if self.peer => drain_bell(c),
            _ => 0,
        }
    }

    pub(super) fn drop_conn(&mut self) {
        // Closing it takes it out of the poller.
        self.conn = None;
        self.registered = false;
        self.peer = false;
        self.sent = false;
    }

    /// Moves the exchange on: accepts or connects, sends our hello,
    /// takes the peer's, notices a peer that left. Runs at every tick.
    pub(super) fn step(&mut self, side: Side, attached: bool, now: Instant) {
        if let Some(c) = &self.conn {
            if sys::peer_hung_up(c.as_raw_fd()) {
                debug!(path = %self.sock_path.display(), "doorbell peer left");
                self.drop_conn();
            }
        }
        match side {
            Side::Host => {
                // A newer connection (a restarted guest) replaces the old one.
                while let Some(Ok(Some(c))) = self.listener.as_ref().map(sys::accept) {
                    self.drop_conn();
                    self.conn = Some(c);
                }
            }
            Side::Guest => {
                if self.conn.is_none() && attached && now >= self.retry_at {
                    self.retry_at = now + BELL_RETRY;
                    if let Ok(c) = connect_seqpacket(&self.sock_path) {
                        self.conn = Some(c);
                    }
                }
            }
        }
        let Some(c) = &self.conn else {
            return;
        };
        // The guest speaks first; the host answers once it has the guest's.
        if side == Side::Guest && !self.sent {
            match sys::send(c.as_raw_fd(), BELL_HELLO, None) {
                Ok(Sent::Done) => self.sent = true,
                Ok(Sent::WouldBlock) => return,
                _ => {
                    self.errors += 1;
                    self.drop_conn();
                    return;
                }
            }
        }
        if !self.peer {
            match recv_bell(c) {
                Ok(true) => {
                    if side == Side::Host {
                        match sys::send(c.as_raw_fd(), BELL_HELLO, None) {
                            Ok(Sent::Done) => self.sent = true,
                            _ => {
                                self.errors += 1;
                                self.drop_conn();
                                return;
                            }
                        }
                    }
                    self.peer = true;
                    info!(path = %self.sock_path.display(), "shim-hv doorbells on");
                }
                Ok(false) => {}
                Err(e) => {
                    debug!(path = %self.sock_path.display(), error = %e, "doorbell exchange failed");
                    self.errors += 1;
                    self.drop_conn();
                }
            }
        }
    }
}

/// Gives the host's doorbell socket `bell` the access the shared file at
/// `path` gives, read and write for its owner (and its group, if it may
/// write the file), whatever the daemon's umask: anyone who may connect
/// can take the guest's place as the doorbell peer.
pub(super) fn restrict_bell(path: &Path, bell: &Path) -> io::Result<()> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let group = std::fs::metadata(path).is_ok_and(|m| m.mode() & 0o020 != 0);
    let mode = if group { 0o660 } else { 0o600 };
    std::fs::set_permissions(bell, std::fs::Permissions::from_mode(mode))
}

/// A non-blocking `SOCK_SEQPACKET` connection to `path`.
pub(super) fn connect_seqpacket(path: &Path) -> io::Result<OwnedFd> {
    use nix::sys::socket::{self as s, AddressFamily, SockFlag, SockType, UnixAddr};
    let e = |e: nix::Error| io::Error::from_raw_os_error(e as i32);
    let fd = s::socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(e)?;
    let addr = UnixAddr::new(path).map_err(e)?;
    s::connect(fd.as_raw_fd(), &addr).map_err(e)?;
    Ok(fd)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::socket::{sendmsg, socketpair, ControlMessage, MsgFlags, SockFlag, SockType};
    use std::io::{IoSlice, Read};

    /// A hello that carries descriptors is refused, and every descriptor
    /// it carried is closed, however many (a peer that could leave some
    /// in the daemon would exhaust its descriptors by reconnecting).
    #[test]
    fn descriptors_sent_with_a_hello_are_all_closed() {
        for count in [1usize, 3, 40] {
            let (ours, theirs) = socketpair(
                nix::sys::socket::AddressFamily::Unix,
                SockType::SeqPacket,
                None,
                SockFlag::SOCK_CLOEXEC,
            )
            .unwrap();
            let (rd, wr) =
                nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC | nix::fcntl::OFlag::O_NONBLOCK)
                    .unwrap();
            let fds = vec![wr.as_raw_fd(); count];
            let cmsg = [ControlMessage::ScmRights(&fds)];
            sendmsg::<()>(
                theirs.as_raw_fd(),
                &[IoSlice::new(BELL_HELLO)],
                &cmsg,
                MsgFlags::empty(),
                None,
            )
            .unwrap();
            drop(wr);
            assert!(recv_bell(&ours).is_err(), "{count} descriptors: refused");
            // Every write end is closed: the pipe reads as ended at once
            // (a write end left open would read as "would block").
            let mut rd = std::fs::File::from(rd);
            let mut b = [0u8; 1];
            assert_eq!(
                rd.read(&mut b).unwrap(),
                0,
                "{count} descriptors: all closed"
            );
        }
    }
}
