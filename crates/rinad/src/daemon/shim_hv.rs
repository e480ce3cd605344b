//! The shared-memory side of a shim-hv IPCP: the mapped VMPI region, the
//! polling of its rings, and the send paths.
//!
//! The host side creates the file (`path`, typically under `/dev/shm`),
//! sizes it (a power of two, as a QEMU `ivshmem-plain` device needs) and
//! lays out the header and both rings; the guest side maps the file (or the
//! BAR 2 `resource2` file of an ivshmem PCI device in a VM) and attaches,
//! retrying every tick until the host has laid it out.
//!
//! Notification: doorbells when both daemons run on one machine. The host
//! side listens on a Unix socket next to the file (`PATH.bell`); the guest
//! side connects, and once each has sent the other a hello, a doorbell is
//! a one-byte packet on that connection, each daemon's end in its `mio`
//! loop. (No descriptor crosses: an eventfd or pipe end one daemon sent
//! the other is one open file both hold, whose O_NONBLOCK either can
//! clear; a peer that did, and filled it, would block the other's next
//! ring or drain for good. Each end of the connection is its own daemon's,
//! and is only written and read with `MSG_DONTWAIT`.) A
//! side that finds its receive ring empty (or its send ring full) says so
//! in the ring header and sleeps; the other side rings its doorbell after
//! publishing a record (or freeing slots) only if it asked, so a busy ring
//! costs no system call (see `rina_core::shim_hv::ring`). When to tick is
//! the core's decision (`rina_core::shim_hv::link::Ticker`; when the peer
//! is lost, `Link::tick`'s): the daemon sleeps until the deadline it gives
//! and does the IO. With doorbells it only ticks every `BEAT_EVERY`
//! (50 ms) for heartbeats. Without them (an `ivshmem-plain` device in a VM
//! has no interrupts; no `.bell` socket) it falls back to polling: every
//! `POLL_EVERY` (1 ms) it bumps its heartbeat, checks the peer's and
//! drains the receive ring, draining without sleeping while data comes. With `busy_poll = true` the daemon
//! never sleeps (lowest latency, one core busy); it still rings a peer
//! that sleeps.
//!
//! Copies: an application's SDU is received from its socket straight into
//! the send ring (one `recvmsg` into a reserved record), and handed from
//! the receive ring straight to the peer application's socket (one
//! `sendmsg` from the ring); only SDUs held back, control messages and
//! frames of stacked normal IPCPs are copied in the daemon.
//!
//! Back-pressure, end to end and lossless for applications: when the send
//! ring is full, the SDU waits and the IPCP's flows stop being read until
//! the peer frees slots (its doorbell) or a later tick finds room. Per
//! flow, the machine's credit decides (`rina_core::shim_hv::credit`): a
//! flow whose credit is used up (`ShimHv::may_send`) is not read — only
//! that flow, its application's writes block — until a grant comes in
//! from the peer; at the receiving end, SDUs for an application whose
//! socket (or ring) is full are held, at most the window the machine
//! granted (it drops what goes beyond), and every SDU that reaches the
//! application is told to the machine (`ShimHv::delivered`), which sends
//! the peer more credit. So one stalled application stalls nothing else,
//! and the receive ring is always read. With a peer that does not
//! announce credit, SDUs for an application whose socket is full are held
//! up to [`RX_QUEUE_MAX`] per flow, and then the receive ring is not read
//! until the application catches up (the sender's ring fills and its
//! application's writes block; one stalled application then pauses the
//! other flows of the device, as before credit). A normal IPCP's frames are
//! never held and its flows have no credit. Frames of a normal IPCP stacked on top
//! wait in a bounded backlog ([`N1_BACKLOG_BUFFERS`], [`N1_BACKLOG_BYTES`])
//! while the ring is full and are sent, in order, when the peer frees
//! slots; only what overflows the backlog is lost (counted as
//! `tx_ring_full`). Control messages wait in a backlog of their own.

use super::held::HeldQueue;
use super::*;
use rina_core::buf::PduBuf;
use rina_core::shim_hv::link::{
    region_size, region_used, Backlog, BacklogOutcome, Link, LinkConfig, LinkEvent, RelayRead,
    Ticker,
};
use rina_core::shim_hv::ring::{Geometry, Region, RingError, Segments};
use rina_core::shim_hv::vmpi::{CHANNEL_HEADER, CONTROL_CHANNEL};
use rina_core::shim_hv::{self as core_hv, ShimHv, Side};
use std::os::fd::{FromRawFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::ptr::NonNull;

/// Geometry of the rings a host side lays out: 1024 slots of 4 KiB (4 MiB
/// per direction; a 64 KiB SDU takes 17 slots). The file is 16 MiB.
pub const GEOMETRY: Geometry = Geometry {
    slot_size: 4096,
    slots: 1024,
};
/// Interval between two attempts of the guest side to reach the host's
/// doorbell socket.
const BELL_RETRY: Duration = Duration::from_millis(200);
/// The hello each side of the doorbell connection sends first. (Version 1
/// carried an eventfd; a daemon of that version and this one poll.)
const BELL_HELLO: &[u8; 8] = b"RINAHVB2";
/// Most doorbells read from the connection at once (a peer that keeps
/// sending them cannot hold the daemon there).
const BELL_DRAIN_MAX: usize = 64;
/// Control buffers held while the send ring is full.
const BACKLOG_MAX: usize = 256;
/// Frames of stacked normal IPCPs held while the send ring is full (as
/// many as a second ring of small frames)...
pub const N1_BACKLOG_BUFFERS: usize = 4096;
/// ... and at most this many bytes of them (a second ring's worth).
pub const N1_BACKLOG_BYTES: usize = 4 << 20;
/// SDUs held for one application whose socket is full on a flow without
/// credit (a peer that does not announce it); when such a flow holds this
/// many, the receive ring is not read until the application catches up.
/// (A flow with credit holds at most its window.)
const RX_QUEUE_MAX: usize = 64;

/// A shared mapping of a file, unmapped on drop.
pub(super) struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

impl Mapping {
    pub(super) fn new(file: &std::fs::File, len: usize) -> io::Result<Mapping> {
        // SAFETY: a fresh shared mapping of `len` bytes of an open file; the
        // kernel picks the address.
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
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(p.cast()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(Mapping { ptr, len })
    }

    pub(super) fn region(&self) -> Region {
        // SAFETY: the mapping is page-aligned, readable and writable for
        // `len` bytes, and outlives the link using it (both live in
        // `Attached`, the link dropped first).
        unsafe { Region::new(self.ptr, self.len) }.expect("mmap is page-aligned")
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what `new` mapped; no handle is used after.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// A link and the mapping it lives in (fields drop in order: link first).
struct Attached {
    link: Link,
    _map: Mapping,
}

/// A shim-hv IPCP's shared memory.
pub(super) struct HvIo {
    pub path: PathBuf,
    pub busy_poll: bool,
    att: Option<Attached>,
    session: u32,
    /// When ticks are due (the core decides; see `Ticker`).
    ticker: Ticker,
    /// Control buffers waiting for room in the send ring.
    backlog: Backlog,
    /// Frames of stacked normal IPCPs waiting for room in the send ring.
    n1_backlog: Backlog,
    /// Doorbells, when set up.
    bell: Bell,
    /// The send ring was full and this side asked to be rung when it has room.
    tx_armed: bool,
    /// Until when the receive ring is left unread because frames relayed
    /// from it would find another shim-hv backlog congested (the core's
    /// `RelayGate` decides; the ring is read again then at the latest).
    relay_wake: Option<Instant>,
    /// An application SDU (with its channel header) waiting for room.
    stalled: Option<(PortId, Vec<u8>)>,
    /// Flows whose reading waits for the stall to end.
    parked: Vec<PortId>,
    /// Flows whose reading waits for the peer's credit.
    credit_parked: Vec<PortId>,
    /// Times a flow waited for credit.
    credit_waits: u64,
    /// Times `n1_backlog` became a quarter full and blocked the N-1 ports of
    /// the normal IPCPs over this one.
    upper_blocks: u64,
    /// Times the receive ring waited for an application's full ring.
    rx_ring_waits: u64,
    pub rx_queued: bool,
    /// SDUs waiting for applications' sockets, by flow.
    rx_pending: IdMap<PortId, HeldQueue<Vec<u8>>>,
    /// The flow whose full queue pauses the receive ring.
    rx_paused_on: Option<PortId>,
    /// Garbage found in the receive ring (each time, what was published is dropped).
    rx_ring_errors: u64,
    /// Inconsistent indices found in the send ring.
    tx_ring_errors: u64,
    /// Failed attempts to map or attach.
    attach_errors: u64,
    /// The last refusal of the file logged (the guest side retries at
    /// every tick; each new reason is logged once).
    attach_refused: Option<String>,
}

/// The doorbells of one device: a Unix connection between both daemons,
/// each end its own daemon's; a doorbell is a one-byte packet on it.
struct Bell {
    /// Where the host side listens (`PATH.bell`).
    sock_path: PathBuf,
    /// Whether `conn` is in the poller (its readiness is the IPCP's).
    registered: bool,
    /// The host's listening socket.
    listener: Option<OwnedFd>,
    /// The connection; its hang-up says the peer left.
    conn: Option<OwnedFd>,
    /// Whether our hello went out on `conn`.
    sent: bool,
    /// Whether the peer's hello came: doorbells are on.
    peer: bool,
    /// When the guest side next tries to connect.
    retry_at: Instant,
    /// Times we rang the peer.
    rung: u64,
    /// Times our doorbell woke us.
    wakeups: u64,
    /// Exchanges that failed (bad message, no descriptor).
    errors: u64,
}

/// Refuses a host's shared-memory file that someone else could shrink
/// under the daemon (a mapping of a file cut short faults with SIGBUS,
/// which kills it): one that is not a regular file, belongs to another
/// user or is writable by anyone (the file the daemon creates is 0600; an
/// existing one is taken only on these terms, so that a file another
/// user made, or left writable, is never adopted). A group the file's
/// owner gave write access is trusted (a QEMU running as another user).
/// Nor is a file taken that holds something else than a region (or
/// zeros): it would be resized and overwritten.
fn host_file_is_ours(file: &std::fs::File, path: &Path) -> io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let m = file.metadata()?;
    let refuse = |why: String| {
        Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} {why}; remove it (or fix its owner and mode) and start again",
                path.display()
            ),
        ))
    };
    if !m.file_type().is_file() {
        return refuse("is not a regular file".into());
    }
    let euid = sys::euid();
    if m.uid() != euid {
        return refuse(format!(
            "belongs to uid {}, not to the daemon's user (uid {euid}), who could cut it short under the daemon",
            m.uid()
        ));
    }
    if m.mode() & 0o002 != 0 {
        return refuse(format!(
            "is writable by every user (mode {:o}), any of whom could cut it short under the daemon",
            m.mode() & 0o7777
        ));
    }
    // The daemon resizes and lays out the file: one that holds something
    // else (a typo'd path, /etc/passwd asked for by an administrator who
    // is not root) is not overwritten.
    let mut head = [0u8; 8];
    let got = std::os::unix::fs::FileExt::read_at(file, &mut head, 0)?;
    let fresh = head[..got].iter().all(|&b| b == 0);
    if !fresh && head[..got] != rina_core::shim_hv::link::MAGIC[..got] {
        return refuse(format!(
            "holds {} bytes that are not a shim-hv region (no {:?} magic), which the daemon would overwrite",
            m.len(),
            String::from_utf8_lossy(&rina_core::shim_hv::link::MAGIC)
        ));
    }
    Ok(())
}

/// Refuses a file for the guest side that someone other than the
/// daemon's user or root could cut short under its mapping (the first
/// touch of a page past the new end kills the daemon with SIGBUS): one
/// that belongs to another user, or that every user may write. (Anyone
/// may make the file at a host's path before the host does: the host
/// then refuses it, but a guest waiting for the layout took it.) The
/// host's own file qualifies, and so does a device's BAR in sysfs, which
/// belongs to root.
fn guest_file_is_safe(file: &std::fs::File, path: &Path) -> io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let m = file.metadata()?;
    let euid = sys::euid();
    let why = if m.uid() != euid && m.uid() != 0 {
        format!(
            "belongs to uid {}, neither the daemon's user (uid {euid}) nor root",
            m.uid()
        )
    } else if m.mode() & 0o002 != 0 {
        format!("is writable by every user (mode {:o})", m.mode() & 0o7777)
    } else {
        return Ok(());
    };
    Err(io::Error::new(
        io::ErrorKind::PermissionDenied,
        format!(
            "{} {why}, who could cut it short under the daemon; not attached",
            path.display()
        ),
    ))
}

/// Gives the first `len` bytes of the host's file (the header and the
/// rings) their memory now. Pages of a sparse file get theirs when first
/// touched, and on a file system that filled up meanwhile (any user may
/// fill `/dev/shm`) there is none: the process that touches such a page
/// through its mapping is killed (SIGBUS), this daemon or the guest's.
/// A file system without room for them is refused now, with the reason.
/// (One that cannot allocate ahead at all is taken as it is.)
fn allocate_rings(file: &std::fs::File, len: usize) -> io::Result<()> {
    // SAFETY: fallocate on a descriptor we own; a negative return is an
    // error. Mode 0 keeps the bytes there are and allocates the holes.
    if unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len as libc::off_t) } == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EOPNOTSUPP) {
        return Ok(());
    }
    Err(io::Error::new(
        e.kind(),
        format!("cannot allocate the {len} bytes of its rings ahead: {e}"),
    ))
}

/// Opens and maps the region: the host creates and lays it out, the guest
/// attaches to what is there.
fn open_region(path: &Path, side: Side, session: u32) -> io::Result<Attached> {
    let to_io = |e: RingError| io::Error::other(e.to_string());
    match side {
        Side::Host => {
            let size = region_size(GEOMETRY);
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW)
                .open(path)?;
            host_file_is_ours(&file, path)?;
            file.set_len(size as u64)?;
            allocate_rings(&file, region_used(GEOMETRY))?;
            let map = Mapping::new(&file, size)?;
            let link = Link::create(map.region(), GEOMETRY, session, LinkConfig::default())
                .map_err(to_io)?;
            Ok(Attached { link, _map: map })
        }
        Side::Guest => {
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(path)?;
            guest_file_is_safe(&file, path)?;
            let len = file.metadata()?.len() as usize;
            if len < rina_core::shim_hv::link::HEADER {
                return Err(io::Error::other("the file is not laid out yet"));
            }
            let map = Mapping::new(&file, len)?;
            let link = Link::attach(map.region(), session, LinkConfig::default()).map_err(to_io)?;
            Ok(Attached { link, _map: map })
        }
    }
}

/// The machine configuration and shared memory of the shim-hv IPCP of
/// entry `c` of configuration `cfg`.
pub(super) fn new_ipcp(
    ic: &crate::config::IpcpConfig,
) -> Result<(core_hv::Config, Io), DaemonError> {
    let name = ic.name.get_ref().clone();
    let path = ic.path.clone().unwrap_or_default();
    let side = match ic.side {
        Some(crate::config::HvSide::Guest) => Side::Guest,
        _ => Side::Host,
    };
    let session = std::process::id()
        ^ (std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos()))
        | 1;
    let att = match open_region(&path, side, session) {
        Ok(a) => Some(a),
        Err(e) if side == Side::Host => {
            return Err(DaemonError::Io {
                what: format!(
                    "IPCP {name}: cannot create the shared-memory file {}",
                    path.display()
                ),
                source: e,
            })
        }
        Err(e) => {
            info!(ipcp = %name, path = %path.display(), error = %e, "shim-hv guest: waiting for the host side");
            None
        }
    };
    let bell = Bell::new(&path, side, &name);
    let mut hc = core_hv::Config::new(ic.dif.clone(), side);
    hc.vmpi_id = ic.vmpi_id.unwrap_or(0);
    if let Some(m) = &ic.max_sdu {
        hc.max_sdu = *m.get_ref();
    }
    info!(ipcp = %name, dif = %ic.dif, path = %path.display(), ?side, vmpi_id = hc.vmpi_id,
        max_sdu = hc.max_sdu, busy_poll = ic.busy_poll.unwrap_or(false),
        doorbell = %bell.sock_path.display(), "shim-hv IPCP up");
    let io = Io::Hv(Box::new(HvIo {
        path,
        busy_poll: ic.busy_poll.unwrap_or(false),
        att,
        session,
        ticker: Ticker::default(),
        backlog: Backlog::new(BACKLOG_MAX, BACKLOG_MAX * 2048),
        n1_backlog: Backlog::new(N1_BACKLOG_BUFFERS, N1_BACKLOG_BYTES),
        bell,
        tx_armed: false,
        relay_wake: None,
        stalled: None,
        parked: Vec::new(),
        credit_parked: Vec::new(),
        credit_waits: 0,
        upper_blocks: 0,
        rx_ring_waits: 0,
        rx_queued: false,
        rx_pending: IdMap::default(),
        rx_paused_on: None,
        rx_ring_errors: 0,
        tx_ring_errors: 0,
        attach_errors: 0,
        attach_refused: None,
    }));
    Ok((hc, io))
}

impl Drop for HvIo {
    fn drop(&mut self) {
        if let Some(a) = &self.att {
            a.link.detach();
        }
        if self.bell.listener.is_some() {
            let _ = std::fs::remove_file(&self.bell.sock_path);
        }
    }
}

/// Reads the doorbells waiting on `conn` (at most [`BELL_DRAIN_MAX`]),
/// never blocking whatever its flags: how many there were.
fn drain_bell(conn: &OwnedFd) -> usize {
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

/// Whether the peer of a connected socket has hung up.
fn hung_up(fd: &OwnedFd) -> bool {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: one valid pollfd, zero timeout.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    n > 0 && p.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0
}

/// Receives the peer's hello, without blocking: `Ok(false)` if nothing
/// came yet; an error for a message that is not one (descriptors it
/// carries are closed: none is taken from the peer), or a closed
/// connection.
fn recv_bell(conn: &OwnedFd) -> io::Result<bool> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    let mut buf = [0u8; 16];
    let mut iov = [std::io::IoSliceMut::new(&mut buf)];
    let mut space = nix::cmsg_space!([RawFd; 2]);
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
    fn new(path: &Path, side: Side, ipcp: &str) -> Bell {
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
    fn on(&self) -> bool {
        self.peer && self.conn.is_some()
    }

    /// Rings the peer (if doorbells are on): one packet, never blocking
    /// (a full connection already holds doorbells the peer has yet to read).
    fn ring(&mut self) {
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
    fn drain(&mut self) -> usize {
        match &self.conn {
            Some(c) if self.peer => drain_bell(c),
            _ => 0,
        }
    }

    fn drop_conn(&mut self) {
        // Closing it takes it out of the poller.
        self.conn = None;
        self.registered = false;
        self.peer = false;
        self.sent = false;
    }

    /// Moves the exchange on: accepts or connects, sends our hello,
    /// takes the peer's, notices a peer that left. Runs at every tick.
    fn step(&mut self, side: Side, attached: bool, now: Instant) {
        if let Some(c) = &self.conn {
            if hung_up(c) {
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
fn restrict_bell(path: &Path, bell: &Path) -> io::Result<()> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let group = std::fs::metadata(path).is_ok_and(|m| m.mode() & 0o020 != 0);
    let mode = if group { 0o660 } else { 0o600 };
    std::fs::set_permissions(bell, std::fs::Permissions::from_mode(mode))
}

/// A non-blocking `SOCK_SEQPACKET` connection to `path`.
fn connect_seqpacket(path: &Path) -> io::Result<OwnedFd> {
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

/// Takes the peeked buffer of `n` bytes out of the receive ring into `q`,
/// without its channel header; `None` if it could not be read (it is
/// gone from the ring either way).
fn hold_copy<'q>(
    link: &mut Link,
    n: usize,
    q: &'q mut HeldQueue<Vec<u8>>,
) -> Option<&'q HeldQueue<Vec<u8>>> {
    let mut v = vec![0u8; n];
    let ok = link.read_peeked(n, &mut v);
    link.consume(n);
    if !ok {
        return None;
    }
    v.drain(..CHANNEL_HEADER);
    q.push_back(v);
    Some(q)
}

/// The iovecs of `seg` (at most two).
fn iovecs(seg: &Segments) -> ([libc::iovec; 2], usize) {
    let mut v = [libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    }; 2];
    let mut k = 0;
    for (ptr, n) in seg.parts() {
        v[k] = libc::iovec {
            iov_base: ptr.cast(),
            iov_len: n,
        };
        k += 1;
    }
    (v, k)
}

/// Receives one packet from `fd` into ring memory `seg` without blocking.
/// As [`sys::recv`]: the real length of the packet (`MSG_TRUNC`).
fn recv_into(fd: RawFd, seg: &Segments) -> io::Result<Recv> {
    let (mut iov, k) = iovecs(seg);
    // SAFETY: an all-zero msghdr is valid; the iovecs point into the ring's
    // data area (inside the mapping, see `Segments`), which the kernel
    // writes; no Rust reference to that memory exists.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_mut_ptr();
    msg.msg_iovlen = k as _;
    // SAFETY: a valid msghdr whose buffers outlive the call.
    let n = unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_DONTWAIT | libc::MSG_TRUNC) };
    if n < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::EAGAIN) => Ok(Recv::WouldBlock),
            Some(libc::ECONNRESET) => Ok(Recv::Closed),
            _ => Err(e),
        };
    }
    if n == 0 {
        return Ok(if hung_up_raw(fd) {
            Recv::Closed
        } else {
            Recv::Empty
        });
    }
    Ok(Recv::Packet(n as usize))
}

/// The length of the SDU a non-blocking read of flow `port` got (an empty
/// packet is 0, refused later like any bad SDU), or how serving the flow
/// ends: nothing more to read, or the flow is closed.
fn sdu_len(r: io::Result<Recv>, port: PortId) -> Result<usize, FlowService> {
    match r {
        Ok(Recv::Packet(n)) => Ok(n),
        Ok(Recv::Empty) => Ok(0),
        Ok(Recv::WouldBlock) => Err(FlowService::Drained),
        Ok(Recv::Closed) => Err(FlowService::Closed),
        Err(e) => {
            debug!(port, error = %e, "flow read error");
            Err(FlowService::Closed)
        }
    }
}

fn hung_up_raw(fd: RawFd) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: one valid pollfd, zero timeout.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    n > 0 && p.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0
}

/// Sends ring memory `seg` as one packet on `fd` without blocking.
fn send_from(fd: RawFd, seg: &Segments) -> io::Result<Sent> {
    let (mut iov, k) = iovecs(seg);
    // SAFETY: as in `recv_into`; the kernel only reads the ring memory.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_mut_ptr();
    msg.msg_iovlen = k as _;
    // SAFETY: a valid msghdr whose buffers outlive the call.
    let n = unsafe { libc::sendmsg(fd, &msg, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
    if n < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::EAGAIN) => Ok(Sent::WouldBlock),
            Some(libc::EMSGSIZE) => Ok(Sent::TooBig),
            Some(libc::EPIPE) | Some(libc::ECONNRESET) => Ok(Sent::Closed),
            _ => Err(e),
        };
    }
    Ok(Sent::Done)
}

impl HvIo {
    /// Whether this side sleeps on its doorbell between ticks.
    fn sleeps_on_bell(&self) -> bool {
        self.bell.on() && !self.busy_poll
    }

    /// Rings the peer if it sleeps on an empty receive ring (call after
    /// publishing).
    fn wake_peer_for_data(&mut self) {
        if let Some(a) = &self.att {
            if self.bell.on() && a.link.peer_wants_data() {
                self.bell.ring();
            }
        }
    }

    /// Sends a control buffer the machine asked for, or holds it.
    pub fn send_control(&mut self, buf: Vec<u8>) {
        let Some(a) = &mut self.att else {
            // Not attached: it waits (the peer cannot be up anyway).
            let _ = self.backlog.queue_only(&[&buf]);
            return;
        };
        match self.backlog.send(&mut a.link, &[&buf]) {
            BacklogOutcome::Sent => self.wake_peer_for_data(),
            BacklogOutcome::Queued | BacklogOutcome::Overflow => {}
            BacklogOutcome::Failed(RingError::BadIndex { .. }) => self.tx_ring_errors += 1,
            BacklogOutcome::Failed(e) => debug!(error = %e, "control buffer not sent"),
        }
    }

    /// Sends what waited for room; true if nothing waits any more.
    fn flush(&mut self, m: &mut ShimHv) -> bool {
        let Some(a) = &mut self.att else {
            return false;
        };
        let mut sent = false;
        let mut done = true;
        for bl in [&mut self.backlog, &mut self.n1_backlog] {
            let before = bl.len();
            match bl.flush(&mut a.link) {
                Ok(true) => {}
                Ok(false) => done = false,
                Err(_) => {
                    self.tx_ring_errors += 1;
                    done = false;
                }
            }
            sent |= bl.len() < before;
            if !done {
                break;
            }
        }
        if done {
            if let Some((port, b)) = &self.stalled {
                match a.link.send(&[b]) {
                    Ok(()) => {
                        sent = true;
                        self.stalled = None;
                    }
                    Err(RingError::Full) => done = false,
                    Err(RingError::BadIndex { .. }) => {
                        self.tx_ring_errors += 1;
                        done = false;
                    }
                    Err(_) => {
                        let (port, len) = (*port, b.len() - CHANNEL_HEADER);
                        m.unsend(port, len);
                        self.stalled = None;
                    }
                }
            }
        }
        if sent {
            self.wake_peer_for_data();
        }
        if done {
            self.tx_armed = false;
        }
        done
    }

    /// Bytes the first waiting buffer needs.
    fn waiting_len(&self) -> Option<usize> {
        self.backlog
            .front_len()
            .or(self.n1_backlog.front_len())
            .or(self.stalled.as_ref().map(|(_, b)| b.len()))
    }

    /// The send ring is full: with doorbells, asks the peer to ring when
    /// it has room. True if room appeared meanwhile (flush again now).
    fn arm_tx(&mut self) -> bool {
        if !self.sleeps_on_bell() {
            return false;
        }
        let Some(len) = self.waiting_len() else {
            return false;
        };
        let Some(a) = &mut self.att else {
            return false;
        };
        self.tx_armed = true;
        !a.link.arm_tx(len)
    }

    /// The send ring has no room for `len` bytes of a flow's rings: with
    /// doorbells, asks the peer to ring when it has. True if room appeared
    /// meanwhile (try again now).
    fn arm_tx_for(&mut self, len: usize) -> bool {
        if !self.sleeps_on_bell() {
            return false;
        }
        let Some(a) = &mut self.att else {
            return false;
        };
        self.tx_armed = true;
        !a.link.arm_tx(len)
    }

    /// Flow `port` has no credit: it is not read until a grant comes.
    fn park_for_credit(&mut self, port: PortId) {
        if !self.credit_parked.contains(&port) {
            self.credit_parked.push(port);
            self.credit_waits += 1;
        }
    }

    /// Whether application SDUs or control buffers wait for room.
    pub fn stalled(&self) -> bool {
        self.stalled.is_some() || !self.backlog.is_empty()
    }

    /// Its address, for listings: the VMPI-id, side and file.
    pub fn address(&self, m: &ShimHv) -> String {
        let c = m.config();
        let side = match c.side {
            Side::Host => "host",
            Side::Guest => "guest",
        };
        let state = if m.is_peer_up() {
            "peer up"
        } else if self.att.is_some() {
            "peer down"
        } else {
            "not attached"
        };
        let bell = if self.bell.on() { ", doorbells" } else { "" };
        format!(
            "vmpi {} ({side}, {}, {state}{bell})",
            c.vmpi_id,
            self.path.display()
        )
    }

    /// IPCP-wide counters, the machine's and the driver's.
    pub fn counters(&self, m: &ShimHv) -> BTreeMap<String, u64> {
        let mut c = m.counters().to_map();
        c.insert("rx_ring_errors".into(), self.rx_ring_errors);
        c.insert("tx_ring_errors".into(), self.tx_ring_errors);
        c.insert("tx_ring_full".into(), self.n1_backlog.overflow());
        c.insert("tx_backlog_queued".into(), self.n1_backlog.queued());
        c.insert("tx_backlog_len".into(), self.n1_backlog.len() as u64);
        c.insert("relay_pauses".into(), m.relay_pauses());
        c.insert("upper_blocks".into(), self.upper_blocks);
        c.insert("rx_ring_waits".into(), self.rx_ring_waits);
        c.insert("credit_waits".into(), self.credit_waits);
        c.insert("control_dropped".into(), self.backlog.overflow());
        c.insert("attach_errors".into(), self.attach_errors);
        c.insert("peer_up".into(), u64::from(m.is_peer_up()));
        c.insert("doorbell".into(), u64::from(self.bell.on()));
        c.insert("bell_rung".into(), self.bell.rung);
        c.insert("bell_wakeups".into(), self.bell.wakeups);
        c.insert("bell_errors".into(), self.bell.errors);
        c.insert("ticks".into(), self.ticker.ticks());
        c
    }

    /// Its RIB: address, names and flows with their counters.
    pub fn rib(&self, m: &ShimHv) -> rina_core::rib::Rib {
        use rina_core::rib::{self, ObjValue, Rib};
        let mut r = Rib::new(rib::Config::default());
        let _ = r.create_with_parents(
            "/shim/addr",
            "address",
            ObjValue::Str(self.address(m)),
            rib::OwnerId::NAMESPACE_MANAGER,
        );
        for (port, f) in m.flows() {
            let _ = r.create_with_parents(
                &format!("/shim/flows/pid={port}"),
                "Flow",
                ObjValue::Str(format!(
                    "{} -> {} on channel {}; SDUs in {} out {}",
                    f.local, f.remote, f.channel, f.counters.sdus_in, f.counters.sdus_out
                )),
                rib::OwnerId::FLOW_ALLOCATOR,
            );
        }
        r
    }
}

/// The driver and the machine of shim-hv IPCP `i`, borrowed together.
fn parts<'a>(
    ipcps: &'a mut [Ipcp],
    sys: &'a mut System,
    i: usize,
) -> Option<(&'a mut HvIo, &'a mut ShimHv)> {
    let Io::Hv(h) = &mut ipcps.get_mut(i)?.io else {
        return None;
    };
    let Some(Machine::ShimHv(m)) = sys.member_mut(i).map(|m| &mut m.machine) else {
        return None;
    };
    Some((h, m))
}

impl Daemon {
    /// When the next shim-hv tick is due (now, for busy-polling IPCPs).
    pub(super) fn hv_timeout(&self) -> Option<Instant> {
        self.ipcps
            .iter()
            .filter_map(|ip| match &ip.io {
                Io::Hv(h) => {
                    let tick = h.ticker.poll_timeout(h.busy_poll);
                    Some(h.relay_wake.map_or(tick, |t| t.min(tick)))
                }
                _ => None,
            })
            .min()
    }

    /// Runs the due ticks of shim-hv IPCPs: attach, doorbell exchange,
    /// heartbeats, sends held back, and a poll of the receive ring.
    pub(super) fn hv_ticks(&mut self, now: Instant) {
        // Relay pauses that are over: read a batch.
        let mut over = Vec::new();
        for (i, ip) in self.ipcps.iter_mut().enumerate() {
            if let Io::Hv(h) = &mut ip.io {
                if h.relay_wake.is_some_and(|t| t <= now) {
                    h.relay_wake = None;
                    over.push(i);
                }
            }
        }
        for i in over {
            self.mark_medium_ready(i);
        }
        for i in 0..self.ipcps.len() {
            let Some(side) = (match self.machine(i) {
                Some(Machine::ShimHv(m)) => Some(m.config().side),
                _ => None,
            }) else {
                continue;
            };
            let ipcp = &mut self.ipcps[i];
            let name = &ipcp.name;
            let Io::Hv(h) = &mut ipcp.io else {
                continue;
            };
            if !h.ticker.due(now, h.busy_poll) {
                continue;
            }
            if h.att.is_none() && side == Side::Guest {
                match open_region(&h.path, Side::Guest, h.session) {
                    Ok(a) => {
                        info!(ipcp = %name, "shim-hv guest attached");
                        h.att = Some(a);
                    }
                    Err(e) => {
                        h.attach_errors += 1;
                        let why = e.to_string();
                        if e.kind() == io::ErrorKind::PermissionDenied
                            && h.attach_refused.as_ref() != Some(&why)
                        {
                            warn!(ipcp = %name, error = %why, "shim-hv guest: file refused");
                            h.attach_refused = Some(why);
                        }
                    }
                }
            }
            h.bell.step(side, h.att.is_some(), now);
            if !h.bell.registered {
                if let Some(fd) = &h.bell.conn {
                    // Its readiness is served as the IPCP's (see service_hv).
                    h.bell.registered = self
                        .poll
                        .registry()
                        .register(
                            &mut SourceFd(&fd.as_raw_fd()),
                            token(T_UDP, i),
                            Interest::READABLE,
                        )
                        .is_ok();
                }
            }
            h.ticker.ran(now, h.sleeps_on_bell());
            let Some(a) = &mut h.att else {
                continue;
            };
            match a.link.tick(now) {
                Some(LinkEvent::Up) => {
                    info!(ipcp = %name, "shim-hv peer up");
                    self.sys.hv_peer(now, i, true);
                }
                Some(LinkEvent::Down) => {
                    warn!(ipcp = %name, "shim-hv peer gone; its flows are closed");
                    h.backlog.clear();
                    h.n1_backlog.clear();
                    h.stalled = None;
                    h.credit_parked.clear();
                    self.sys.hv_peer(now, i, false);
                    self.sys.medium_writable(now, i);
                }
                None => {}
            }
            self.mark_medium_ready(i);
        }
    }

    /// Sends what waits for room in the send ring of shim-hv IPCP `i`,
    /// reads the flows parked on it once it all went, and opens the N-1
    /// ports over it once its backlog is less than a quarter full.
    fn hv_flush_tx(&mut self, i: usize) {
        let now = self.now();
        let Some((h, m)) = parts(&mut self.ipcps, &mut self.sys, i) else {
            return;
        };
        let was_congested = h.n1_backlog.is_congested();
        let was_filling = h.n1_backlog.is_filling();
        let (flushed, again) = if h.flush(m) {
            (std::mem::take(&mut h.parked), false)
        } else {
            (Vec::new(), h.arm_tx())
        };
        let relieved = was_filling && !h.n1_backlog.is_filling();
        for port in flushed {
            self.mark_flow_ready(port);
        }
        if again {
            self.mark_medium_ready(i);
        }
        if relieved {
            self.sys.medium_writable(now, i);
        }
        if was_congested && !self.hv_congested_besides(usize::MAX) {
            // Rings whose reading paused for this backlog are read again.
            for k in self.sys.hv_relay_released() {
                if let Some(Io::Hv(h)) = self.ipcps.get_mut(k).map(|ip| &mut ip.io) {
                    h.relay_wake = None;
                }
                self.mark_medium_ready(k);
            }
        }
    }

    /// Whether the backlog of stacked IPCPs' frames of a shim-hv IPCP
    /// other than `i` is at least half full.
    fn hv_congested_besides(&self, i: usize) -> bool {
        self.ipcps.iter().enumerate().any(|(k, ip)| match &ip.io {
            Io::Hv(h) => k != i && h.n1_backlog.is_congested(),
            _ => false,
        })
    }

    /// Hop-by-hop back-pressure for relays: whether the receive ring of
    /// shim-hv IPCP `i` is left unread now, as the core decides
    /// (`System::hv_may_read`) from whether another shim-hv backlog is
    /// congested; a paused ring is read again at the time the core gives.
    fn hv_relay_blocked(&mut self, i: usize, now: Instant) -> bool {
        let congested = self.hv_congested_besides(i);
        let wake = match self.sys.hv_may_read(now, i, congested) {
            RelayRead::Now => None,
            RelayRead::PausedUntil(t) => Some(t),
        };
        if let Io::Hv(h) = &mut self.ipcps[i].io {
            h.relay_wake = wake;
        }
        wake.is_some()
    }

    /// Serves shim-hv IPCP `i` (its tick, its doorbell, or more to read):
    /// sends what waited, then takes up to [`BUDGET`] buffers from the
    /// receive ring; true if there may be more.
    pub(super) fn service_hv(&mut self, i: usize) -> bool {
        let now = self.now();
        if let Io::Hv(h) = &mut self.ipcps[i].io {
            if h.bell.drain() > 0 {
                h.bell.wakeups += 1;
            }
        }
        self.hv_flush_tx(i);
        if self.hv_relay_blocked(i, now) {
            return false;
        }
        if let Io::Hv(h) = &mut self.ipcps[i].io {
            // Queues of flows closed meanwhile are dropped, and do not pause.
            h.rx_pending.retain(|p, _| self.flows.contains_key(p));
            if let Some(p) = h.rx_paused_on {
                // A flow with rings pauses the ring with nothing held (its
                // SDU waits in the ring itself) until its application kicks.
                let waits_in_ring = self.flows.get(&p).is_some_and(|f| f.rings.is_some());
                if !waits_in_ring && !h.rx_pending.contains_key(&p) {
                    h.rx_paused_on = None;
                }
            }
            if h.rx_paused_on.is_some() {
                return false;
            }
        }
        let mut more = true;
        for _ in 0..BUDGET {
            match self.hv_take_one(i, now) {
                Some(true) => {}
                Some(false) => {
                    more = false;
                    break;
                }
                None => {
                    // Empty: sleep on the doorbell if the peer will ring it.
                    more = false;
                    if let Io::Hv(h) = &self.ipcps[i].io {
                        if let Some(a) = &h.att {
                            if h.sleeps_on_bell() && !a.link.arm_rx() {
                                more = true;
                            }
                        }
                    }
                    break;
                }
            }
        }
        // After any slot was freed (also by a read that then stopped):
        // ring a producer that sleeps on a full ring.
        if let Io::Hv(h) = &mut self.ipcps[i].io {
            if let Some(a) = &h.att {
                if h.bell.on() && a.link.peer_wants_room() {
                    h.bell.ring();
                }
            }
        }
        self.hv_credit_moved(i, now);
        more
    }

    /// Tells the machine of shim-hv IPCP `i` that an SDU of `len` bytes of
    /// flow `port` reached its application, and sends what follows.
    fn hv_delivered(&mut self, now: Instant, i: usize, port: PortId, len: u64) {
        self.sys.with_machine(now, i, |m| {
            if let Machine::ShimHv(h) = m {
                h.delivered(now, port, 1, len);
            }
        });
    }

    /// After buffers came in or SDUs went to applications on shim-hv IPCP
    /// `i`: flows that waited for credit and got some are read again, and
    /// the grants the machine made for what applications took are sent.
    fn hv_credit_moved(&mut self, i: usize, now: Instant) {
        let Some((h, m)) = parts(&mut self.ipcps, &mut self.sys, i) else {
            return;
        };
        let mut go = Vec::new();
        h.credit_parked.retain(|&p| {
            let can = m.may_send(p);
            if can {
                go.push(p);
            }
            !can
        });
        let grants = m.has_actions();
        for p in go {
            self.mark_flow_ready(p);
        }
        if grants {
            self.sys.settle(now);
        }
    }

    /// Takes one buffer from the receive ring of shim-hv IPCP `i`: `None`
    /// if the ring is empty, `Some(false)` if reading must stop (garbage,
    /// or an application's queue is full), `Some(true)` otherwise. SDUs of
    /// application flows go from the ring to the application without a
    /// copy in the daemon; control buffers and frames of normal IPCPs
    /// above go to the system from one copy.
    fn hv_take_one(&mut self, i: usize, now: Instant) -> Option<bool> {
        let mut tapped = self.sys.medium_tapped(i).then_some(None);
        let took = self.hv_take_one_inner(i, now, &mut tapped);
        if let Some(Some(frame)) = tapped {
            self.sys.tap_moved(i, false, frame);
        }
        took
    }

    /// A VMPI buffer of no application flow (control, a frame of a normal
    /// IPCP above, or garbage), copied to the first `n` bytes of the
    /// daemon's buffer: to the system, and what it delivers to its flow.
    fn hv_copy_to_system(&mut self, i: usize, now: Instant, n: usize) {
        let rx = rina_core::system::Rx::Hv {
            buf: &self.buf[..n],
        };
        if let Some((port, sdu)) = self.sys.receive(now, i, rx) {
            let len = sdu.len() as u64;
            super::shim::straight_to_app(&mut self.flows, &mut self.sys, i, port, sdu);
            self.hv_delivered(now, i, port, len);
        }
    }

    /// [`Daemon::hv_take_one`]; a buffer of an application flow that left
    /// the ring is copied into `tapped` if it is `Some` (a capture).
    fn hv_take_one_inner(
        &mut self,
        i: usize,
        now: Instant,
        tapped: &mut Option<Option<Vec<u8>>>,
    ) -> Option<bool> {
        let name = self.ipcps[i].name.clone();
        let (h, m) = parts(&mut self.ipcps, &mut self.sys, i)?;
        let Some(a) = &mut h.att else {
            return Some(false);
        };
        let seg = match a.link.peek() {
            Ok(Some(s)) => s,
            Ok(None) => return None,
            Err(e) => {
                h.rx_ring_errors += 1;
                debug!(ipcp = %name, error = %e, "garbage in the receive ring; dropped what was published");
                return Some(false);
            }
        };
        let n = seg.len();
        let mut ch = [0u8; CHANNEL_HEADER];
        let app_port = (n > CHANNEL_HEADER && a.link.read_peeked(n, &mut ch))
            .then(|| m.channel_port(u32::from_le_bytes(ch)))
            .flatten()
            .filter(|p| self.flows.contains_key(p));
        let Some(port) = app_port else {
            // Control, a frame of a normal IPCP above, or garbage: to the
            // system from a copy.
            let copied = n <= self.buf.len() && a.link.read_peeked(n, &mut self.buf[..n]);
            a.link.consume(n);
            if !copied {
                // Larger than any buffer the DIF carries: garbage, counted.
                h.rx_ring_errors += 1;
                debug!(ipcp = %name, len = n, "VMPI buffer larger than any the DIF carries; dropped");
                return Some(true);
            }
            self.hv_copy_to_system(i, now, n);
            return Some(true);
        };
        let sdu_len = n - CHANNEL_HEADER;
        if let Some(t) = tapped.as_mut() {
            *t = Some(seg.to_vec());
        }
        if let Err(reason) = m.on_data_header(u32::from_le_bytes(ch), sdu_len) {
            a.link.consume(n);
            debug!(ipcp = %name, ?reason, "VMPI buffer dropped");
            return Some(true);
        }
        let sdu = seg.skip(CHANNEL_HEADER);
        let mut ready = None;
        // With credit, what the application cannot take yet is held here
        // (at most the window the machine granted): the ring is never left
        // unread for one flow.
        let credit = m.rx_flow_controlled(port);
        let taken = if let Some(r) = self.flows.get_mut(&port).and_then(|fs| fs.rings.as_mut()) {
            // Ring to ring, unless SDUs are held before it.
            let held = h.rx_pending.get(&port).is_some_and(|q| !q.is_empty());
            if !held {
                if let Ok(dst) = r.to_app.reserve(sdu_len) {
                    sdu.copy_to(&dst);
                    let ok = r.to_app.commit(sdu_len, sdu_len).is_ok();
                    a.link.consume(n);
                    if ok {
                        r.wake();
                    }
                    m.delivered(now, port, 1, sdu_len as u64);
                    return Some(true);
                }
            }
            if !held && !credit {
                // The application's ring is full: the SDU stays in the VMPI
                // ring (no copy) and the ring is not read until the
                // application kicks, which fills the peer's ring and holds
                // its writers back.
                m.unreceive(port, sdu_len);
                // Still in the ring: captured when it leaves.
                *tapped = None;
                if r.want_room(sdu_len) {
                    return Some(true);
                }
                h.rx_paused_on = Some(port);
                h.rx_ring_waits += 1;
                return Some(false);
            }
            let Some(q) = hold_copy(&mut a.link, n, h.rx_pending.entry(port).or_default()) else {
                m.delivered(now, port, 1, sdu_len as u64);
                return Some(true);
            };
            let full = !credit && q.len() >= RX_QUEUE_MAX;
            // The application kicks once it made room (or room is there now).
            if q.front().is_some_and(|f| !r.to_app.arm(f.len())) {
                ready = Some(port);
            }
            if full {
                h.rx_paused_on = Some(port);
            }
            Some(!full)
        } else {
            let fd = self.flows.get(&port).map(|fs| fs.fd.as_raw_fd())?;
            let held = h.rx_pending.get(&port).is_some_and(|q| !q.is_empty());
            // Straight from the ring to the application's socket.
            let sent = if held {
                Ok(Sent::WouldBlock)
            } else {
                send_from(fd, &sdu)
            };
            match sent {
                Ok(Sent::Done) => {
                    a.link.consume(n);
                    m.delivered(now, port, 1, sdu_len as u64);
                    Some(true)
                }
                Ok(Sent::WouldBlock) => {
                    let Some(q) = hold_copy(&mut a.link, n, h.rx_pending.entry(port).or_default())
                    else {
                        m.delivered(now, port, 1, sdu_len as u64);
                        return Some(true);
                    };
                    // Held within the window with credit; without, the
                    // ring pauses at RX_QUEUE_MAX.
                    let full = !credit && q.len() >= RX_QUEUE_MAX;
                    let _ = self.poll.registry().reregister(
                        &mut SourceFd(&fd),
                        token(T_FLOW, port as usize),
                        Interest::READABLE | Interest::WRITABLE,
                    );
                    if full {
                        h.rx_paused_on = Some(port);
                    }
                    Some(!full)
                }
                _ => {
                    a.link.consume(n);
                    if let Some(c) = m.flow_counters_mut(port) {
                        c.drops_in += 1;
                    }
                    m.delivered(now, port, 1, sdu_len as u64);
                    Some(true)
                }
            }
        };
        if let Some(p) = ready {
            self.mark_flow_ready(p);
        }
        taken
    }

    /// The application's socket of shim-hv flow `port` can take more: hand
    /// it what was held, and read the ring again if it was paused for it.
    pub(super) fn hv_flush_rx(&mut self, port: PortId) {
        let Some(slot) = self.flows.get(&port) else {
            return;
        };
        if slot.rings.is_some() {
            // Held SDUs go to the ring when the application kicks.
            return;
        }
        let (fd, i) = (slot.fd.as_raw_fd(), slot.ipcp);
        let now = self.now();
        let Some((h, m)) = parts(&mut self.ipcps, &mut self.sys, i) else {
            return;
        };
        let Some(q) = h.rx_pending.get_mut(&port) else {
            return;
        };
        let (mut sdus, mut bytes) = (0u64, 0u64);
        while let Some(sdu) = q.front() {
            match sys::send(fd, sdu, None) {
                Ok(Sent::Done) => {}
                Ok(Sent::WouldBlock) => break,
                _ => {
                    // Gone with the flow: their credit too.
                    sdus += q.len() as u64;
                    bytes += q.iter().map(|v| v.len() as u64).sum::<u64>();
                    q.clear();
                    break;
                }
            }
            sdus += 1;
            bytes += sdu.len() as u64;
            q.pop_front();
        }
        m.delivered(now, port, sdus, bytes);
        let (len, empty) = (q.len(), q.is_empty());
        if empty {
            h.rx_pending.remove(&port);
            let _ = self.poll.registry().reregister(
                &mut SourceFd(&fd),
                token(T_FLOW, port as usize),
                Interest::READABLE,
            );
        }
        if h.rx_paused_on == Some(port) && len < RX_QUEUE_MAX / 2 {
            h.rx_paused_on = None;
            self.mark_medium_ready(i);
        }
        self.hv_credit_moved(i, now);
    }

    /// Sends a buffer the system asked for on shim-hv IPCP `i`: control
    /// messages through their backlog, frames of normal IPCPs above
    /// through theirs. While that backlog is a quarter full the N-1 ports over
    /// this IPCP are blocked, so PDUs wait in the RMT above, where the
    /// scheduling policy decides; only what overflows the backlog is lost
    /// (counted as `tx_ring_full`).
    pub(super) fn hv_send(&mut self, i: usize, frame: PduBuf) {
        let now = self.now();
        let Io::Hv(h) = &mut self.ipcps[i].io else {
            return;
        };
        let control = frame
            .get(..CHANNEL_HEADER)
            .is_none_or(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) == CONTROL_CHANNEL);
        if control {
            h.send_control(frame.into_vec());
            return;
        }
        let Some(a) = &mut h.att else {
            return;
        };
        let was_waiting = !h.n1_backlog.is_empty();
        let was_filling = h.n1_backlog.is_filling();
        // Control messages waiting go first: they may open the channel.
        let out = if h.backlog.is_empty() {
            h.n1_backlog.send(&mut a.link, &[&frame])
        } else {
            h.n1_backlog.queue_only(&[&frame])
        };
        let mut again = false;
        match out {
            BacklogOutcome::Sent => h.wake_peer_for_data(),
            BacklogOutcome::Queued => again = !was_waiting && h.arm_tx(),
            BacklogOutcome::Overflow => {}
            BacklogOutcome::Failed(e) => {
                if matches!(e, RingError::BadIndex { .. }) {
                    h.tx_ring_errors += 1;
                }
            }
        }
        let filling = !was_filling && h.n1_backlog.is_filling();
        if filling {
            h.upper_blocks += 1;
        }
        if again {
            self.mark_medium_ready(i);
        }
        if filling {
            self.sys.medium_blocked(now, i);
        }
    }

    /// Reads up to [`BUDGET`] SDUs written by the application on shim-hv
    /// flow `port` and puts them in the send ring: straight from the
    /// socket into a reserved record when the ring has room for the
    /// largest SDU, else through the daemon's buffer.
    pub(super) fn service_hv_flow(&mut self, port: PortId) -> FlowService {
        let Some(slot) = self.flows.get(&port) else {
            return FlowService::Drained;
        };
        if slot.rings.is_some() {
            return self.service_hv_rings(port);
        }
        let (i, fd) = (slot.ipcp, slot.fd.as_raw_fd());
        // Copies of what is sent, for a capture of the medium.
        let tap = self.sys.medium_tapped(i);
        let mut copies: Vec<Vec<u8>> = Vec::new();
        let Some((h, m)) = parts(&mut self.ipcps, &mut self.sys, i) else {
            return FlowService::Drained;
        };
        if h.stalled() {
            h.parked.push(port);
            return FlowService::Drained;
        }
        let cap = self.buf.len() - HEADROOM;
        let max_sdu = m.config().max_sdu as usize;
        // Room for the channel header, the largest SDU and one byte more
        // (to tell a too-large SDU from a fitting one).
        let reserve = CHANNEL_HEADER + max_sdu + 1;
        let mut result = FlowService::More;
        let mut sent = 0;
        for _ in 0..BUDGET {
            let Some(a) = &mut h.att else {
                break;
            };
            if !m.may_send(port) {
                // Out of credit: this flow only waits (its application's
                // writes block), read again when the peer grants more.
                h.park_for_credit(port);
                result = FlowService::Drained;
                break;
            }
            if let Ok(seg) = a.link.reserve(reserve) {
                let n = match sdu_len(recv_into(fd, &seg.skip(CHANNEL_HEADER)), port) {
                    Ok(n) => n,
                    Err(end) => {
                        result = end;
                        break;
                    }
                };
                let hdr = match m.send_header(port, n) {
                    Ok(hdr) => hdr,
                    Err(e) => {
                        debug!(port, error = %e, "SDU not sent");
                        continue;
                    }
                };
                seg.write_at(0, &hdr);
                if tap {
                    copies.push(seg.prefix(CHANNEL_HEADER + n).to_vec());
                }
                match a.link.commit(reserve, CHANNEL_HEADER + n) {
                    Ok(()) => sent += 1,
                    Err(e) => {
                        if matches!(e, RingError::BadIndex { .. }) {
                            h.tx_ring_errors += 1;
                        }
                        m.unsend(port, n);
                        debug!(port, error = %e, "SDU not sent");
                    }
                }
                continue;
            }
            // Less room than the largest SDU needs: through our buffer.
            let n = match sdu_len(sys::recv(fd, &mut self.buf[HEADROOM..]), port) {
                Ok(n) => n,
                Err(end) => {
                    result = end;
                    break;
                }
            };
            if n > cap {
                if let Some(c) = m.flow_counters_mut(port) {
                    c.drops_out += 1;
                }
                continue;
            }
            let hdr = match m.send_header(port, n) {
                Ok(h) => h,
                Err(e) => {
                    debug!(port, error = %e, "SDU not sent");
                    continue;
                }
            };
            let sdu = &self.buf[HEADROOM..HEADROOM + n];
            if tap {
                // Sent now, or once the ring has room (stalled below).
                copies.push([&hdr[..], sdu].concat());
            }
            match a.link.send(&[&hdr, sdu]) {
                Ok(()) => sent += 1,
                Err(e @ (RingError::Full | RingError::BadIndex { .. })) => {
                    if matches!(e, RingError::BadIndex { .. }) {
                        h.tx_ring_errors += 1;
                    }
                    let mut b = hdr.to_vec();
                    b.extend_from_slice(sdu);
                    h.stalled = Some((port, b));
                    h.parked.push(port);
                    result = FlowService::Drained;
                    break;
                }
                Err(e) => {
                    m.unsend(port, n);
                    debug!(port, error = %e, "SDU not sent");
                }
            }
        }
        if sent > 0 {
            h.wake_peer_for_data();
        }
        if h.stalled.is_some() && h.arm_tx() {
            self.mark_medium_ready(i);
        }
        for c in copies {
            self.sys.tap_moved(i, true, c);
        }
        result
    }

    /// Serves shim-hv flow `port` whose application uses rings (it kicked
    /// the socket, or the flow was parked): drains the kicks, hands SDUs
    /// held for the application to its ring, and moves up to
    /// `4 * BUDGET` SDUs from its ring into the VMPI send ring, copying
    /// ring to ring.
    fn service_hv_rings(&mut self, port: PortId) -> FlowService {
        let now = self.now();
        let Some(slot) = self.flows.get_mut(&port) else {
            return FlowService::Drained;
        };
        let (i, fd) = (slot.ipcp, slot.fd.as_raw_fd());
        if !super::app_rings::drain_kicks(fd) {
            return FlowService::Closed;
        }
        let Some(r) = &mut slot.rings else {
            return FlowService::Drained;
        };
        let tap = self.sys.medium_tapped(i);
        let mut copies: Vec<Vec<u8>> = Vec::new();
        let Some((h, m)) = parts(&mut self.ipcps, &mut self.sys, i) else {
            return FlowService::Drained;
        };
        // Held SDUs first, in order.
        let (mut resume_rx, mut again) = (false, false);
        if h.rx_paused_on == Some(port) && !h.rx_pending.contains_key(&port) {
            // Paused with the SDU left in the VMPI ring: the application read.
            h.rx_paused_on = None;
            resume_rx = true;
        }
        if let Some(q) = h.rx_pending.get_mut(&port) {
            let before = q.bytes();
            let (sent, more) = r.deliver_held(q);
            again = more;
            m.delivered(now, port, sent as u64, (before - q.bytes()) as u64);
            if q.is_empty() {
                h.rx_pending.remove(&port);
            }
            let len = h.rx_pending.get(&port).map_or(0, HeldQueue::len);
            if h.rx_paused_on == Some(port) && len < RX_QUEUE_MAX / 2 {
                h.rx_paused_on = None;
                resume_rx = true;
            }
        }
        if h.stalled() {
            h.parked.push(port);
            if resume_rx {
                self.mark_medium_ready(i);
            }
            let now = self.now();
            self.hv_credit_moved(i, now);
            return if again {
                FlowService::More
            } else {
                FlowService::Drained
            };
        }
        let max_sdu = m.config().max_sdu as usize;
        let (mut sent, mut result, mut full) = (0, FlowService::More, None);
        for _ in 0..4 * BUDGET {
            let Some(a) = &mut h.att else {
                result = FlowService::Drained;
                break;
            };
            if !m.may_send(port) {
                h.park_for_credit(port);
                result = FlowService::Drained;
                break;
            }
            let seg = match r.next_from_app() {
                Ok(Some(seg)) => seg,
                Ok(None) => {
                    result = FlowService::Drained;
                    break;
                }
                Err(e) => {
                    // The application wrote garbage: its own flow suffers.
                    debug!(port, error = %e, "garbage in a flow's ring; dropped what was published");
                    if let Some(c) = m.flow_counters_mut(port) {
                        c.drops_out += 1;
                    }
                    result = FlowService::Drained;
                    break;
                }
            };
            let n = seg.len();
            if n > max_sdu {
                r.from_app.consume(n);
                if let Some(c) = m.flow_counters_mut(port) {
                    c.drops_out += 1;
                }
                continue;
            }
            let need = CHANNEL_HEADER + n;
            let dst = match a.link.reserve(need) {
                Ok(d) => d,
                Err(e) => {
                    if matches!(e, RingError::BadIndex { .. }) {
                        h.tx_ring_errors += 1;
                    }
                    full = Some(need);
                    result = FlowService::Drained;
                    break;
                }
            };
            let hdr = match m.send_header(port, n) {
                Ok(hdr) => hdr,
                Err(e) => {
                    debug!(port, error = %e, "SDU not sent");
                    r.from_app.consume(n);
                    continue;
                }
            };
            dst.write_at(0, &hdr);
            seg.copy_to(&dst.skip(CHANNEL_HEADER));
            r.from_app.consume(n);
            if tap {
                copies.push(dst.prefix(need).to_vec());
            }
            match a.link.commit(need, need) {
                Ok(()) => sent += 1,
                Err(e) => {
                    m.unsend(port, n);
                    debug!(port, error = %e, "SDU not sent");
                }
            }
        }
        r.took();
        if sent > 0 {
            h.wake_peer_for_data();
        }
        if let Some(need) = full {
            // The VMPI ring is full: read on when the peer frees slots.
            h.parked.push(port);
            if h.arm_tx_for(need) {
                result = FlowService::More;
            }
        }
        if resume_rx {
            self.mark_medium_ready(i);
        }
        if again {
            result = FlowService::More;
        }
        for c in copies {
            self.sys.tap_moved(i, true, c);
        }
        let now = self.now();
        self.hv_credit_moved(i, now);
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A fresh directory of its own under the system's temporary one.
    fn scratch(what: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("rinad-hv-{what}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn refusal(path: &Path) -> String {
        match open_region(path, Side::Host, 1) {
            Ok(_) => panic!("{} was taken", path.display()),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn the_host_takes_only_a_file_no_one_else_can_cut_short() {
        let d = scratch("owner");
        // Its own file: created 0600 and laid out.
        let own = d.join("own");
        open_region(&own, Side::Host, 1).expect("a new file");
        let m = std::fs::metadata(&own).unwrap();
        assert_eq!(m.permissions().mode() & 0o777, 0o600);
        assert_eq!(m.len() as usize, region_size(GEOMETRY));
        // Taken again as it is (a restart).
        open_region(&own, Side::Host, 2).expect("its own file again");

        // Writable by every user: refused, and left as it was.
        let open = d.join("open");
        std::fs::write(&open, b"").unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o666)).unwrap();
        let e = refusal(&open);
        assert!(e.contains("writable by every user (mode 666)"), "{e}");
        assert_eq!(std::fs::metadata(&open).unwrap().len(), 0);

        // A file of the daemon's user that holds something else: refused,
        // left as it was (it would have been resized and overwritten).
        let other = d.join("other");
        std::fs::write(&other, b"root:x:0:0:root:/root:/bin/bash\n").unwrap();
        let e = refusal(&other);
        assert!(e.contains("not a shim-hv region"), "{e}");
        assert_eq!(
            std::fs::read(&other).unwrap(),
            b"root:x:0:0:root:/root:/bin/bash\n"
        );
        // An empty (or zeroed) one is laid out.
        let empty = d.join("empty");
        std::fs::write(&empty, b"").unwrap();
        std::fs::set_permissions(&empty, std::fs::Permissions::from_mode(0o600)).unwrap();
        open_region(&empty, Side::Host, 1).expect("an empty file");

        // A symbolic link is not followed; a directory is not a file.
        let link = d.join("link");
        std::os::unix::fs::symlink(&own, &link).unwrap();
        let e = refusal(&link);
        assert!(
            e.contains("symbolic links") || e.contains("(os error 40)"),
            "{e}"
        );
        let e = refusal(&d);
        assert!(
            e.contains("directory") || e.contains("not a regular file"),
            "{e}"
        );

        // Another user's file (root can make one to test with).
        if sys::euid() == 0 {
            let theirs = d.join("theirs");
            std::fs::write(&theirs, b"").unwrap();
            std::os::unix::fs::chown(&theirs, Some(65_534), Some(65_534)).unwrap();
            let e = refusal(&theirs);
            assert!(e.contains("belongs to uid 65534"), "{e}");
            assert_eq!(std::fs::metadata(&theirs).unwrap().len(), 0);
        } else {
            println!("skipped the file of another user: making one needs root");
        }
        std::fs::remove_dir_all(&d).unwrap();
    }
}
