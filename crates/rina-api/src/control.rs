//! Control descriptors (`rina_open`) and the replies to requests made on them.
//!
//! The daemon sends two kinds of messages on a control connection: replies
//! to requests, and flow requests for the names the connection registered,
//! at any time. A C program polls the descriptor `rina_open` gave it and
//! expects it to turn readable exactly when a flow request waits, whatever
//! other calls it makes meanwhile. So that descriptor is not the daemon
//! connection itself but one end of a socket pair; a relay thread per
//! control descriptor reads the daemon connection, passes flow requests
//! (and the flows the daemon accepted for names registered with
//! `RINA_F_ACCEPT`, with their descriptors) to the program's end, and
//! routes each reply (with any descriptor it carries) to the private
//! socket pair of the call waiting for it. Requests are written to the
//! daemon connection directly by the calling thread.
//!
//! The relay ends when the program closes its descriptor (the daemon then
//! withdraws the registrations) or when the daemon goes away (the program's
//! descriptor then reads end-of-file).

use crate::error::{ApiError, Result};
use crate::sys::{self, Deadline, Key};
use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::socket;
use rina_wire::ctl::{self, FlowInfo, IncomingFlow, Message, Op, Reply, Request, MAX_CTL_MSG};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::os::fd::{AsFd, AsRawFd, IntoRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// How long a call waits for the daemon: to take its connection, to take
/// its request, and to answer it.
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(30);

/// [`REPLY_TIMEOUT`] as replaced by [`set_timeout_for_tests`], in
/// microseconds (0: not replaced).
static TIMEOUT_OVERRIDE_US: AtomicU64 = AtomicU64::new(0);

/// How long a call waits for the daemon: [`REPLY_TIMEOUT`], unless a test
/// shortened it.
pub fn timeout() -> Duration {
    match TIMEOUT_OVERRIDE_US.load(Ordering::Relaxed) {
        0 => REPLY_TIMEOUT,
        us => Duration::from_micros(us),
    }
}

/// Replaces [`REPLY_TIMEOUT`] in this process (`None` restores it), so that
/// tests of a stuck daemon need not wait 30 s for each call. For tests
/// only: no C program can reach it.
#[doc(hidden)]
pub fn set_timeout_for_tests(t: Option<Duration>) {
    let us = t.map_or(0, |t| {
        u64::try_from(t.as_micros()).unwrap_or(u64::MAX).max(1)
    });
    TIMEOUT_OVERRIDE_US.store(us, Ordering::Relaxed);
}

/// Largest answer or flow request a call reads: the ones this library asks
/// for (registration, flows) are a few hundred bytes.
const MAX_ANSWER: usize = 64 * 1024;

/// Flow requests (and flows accepted for it) the relay holds for a
/// program that does not read them; beyond this they are dropped (the
/// daemon times a request out; a flow's descriptor closes, which
/// deallocates it).
const MAX_HELD_REQUESTS: usize = 1024;

/// What the program's control descriptor carries, one per packet.
#[derive(Debug)]
pub enum Arrival {
    /// A flow request, for the program to accept or refuse.
    Request(IncomingFlow),
    /// A flow the daemon accepted for a name registered with
    /// `RINA_F_ACCEPT`, and its descriptor.
    Accepted(FlowInfo, OwnedFd),
}

/// A message the relay holds until the program's descriptor has room.
struct Held {
    /// The encoded [`Message::FlowRequest`] or [`Message::FlowAccepted`].
    bytes: Vec<u8>,
    /// The flow's descriptor, for an accepted flow.
    fd: Option<OwnedFd>,
    /// The request's handle, for a request (which the daemon may withdraw).
    handle: Option<u64>,
}

/// One control descriptor's state.
pub struct Conn {
    daemon: OwnedFd,
    next_id: AtomicU64,
    /// Request id -> the waiting call's end of its socket pair.
    routes: Mutex<HashMap<u64, OwnedFd>>,
    /// Handles given to the program (`RINA_F_NORESP`) -> the daemon's.
    handles: Mutex<Handles>,
    /// The daemon closed the connection.
    gone: AtomicBool,
    /// The process that opened it: its relay thread, which takes the
    /// daemon's replies, runs only there.
    pid: u32,
}

#[derive(Default)]
struct Handles {
    next: i32,
    map: HashMap<i32, Pending>,
}

/// What a `RINA_F_NORESP` handle stands for.
#[derive(Debug)]
pub enum Pending {
    /// A flow request, by the daemon's handle: it waits for the answer.
    Request(u64),
    /// A flow the daemon already accepted (a name registered with
    /// `RINA_F_ACCEPT`): accepting hands it over, refusing closes it.
    Accepted(OwnedFd),
}

static CONNS: Mutex<BTreeMap<Key, Arc<Conn>>> = Mutex::new(BTreeMap::new());

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of these locks leaves consistent data.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// `rina_open`: connects to the daemon and starts the relay; returns the
/// program's descriptor.
pub fn open() -> Result<RawFd> {
    let daemon = sys::connect_daemon(&Deadline::after(timeout()))?;
    let (app, relay_end) = sys::seqpacket_pair()?;
    let key = sys::key(app.as_raw_fd())?;
    let conn = Arc::new(Conn {
        daemon,
        next_id: AtomicU64::new(1),
        routes: Mutex::new(HashMap::new()),
        handles: Mutex::new(Handles::default()),
        gone: AtomicBool::new(false),
        pid: std::process::id(),
    });
    lock(&CONNS).insert(key, conn.clone());
    // The relay takes none of the program's signals: one that blocks a
    // signal in its threads to take it with sigwait or signalfd would
    // otherwise be killed by it, delivered to the relay.
    let spawned = sys::with_signals_blocked(|| {
        std::thread::Builder::new()
            .name("rina-api relay".into())
            .spawn(move || relay(conn, relay_end, key))
    });
    if let Err(e) = spawned {
        lock(&CONNS).remove(&key);
        let errno = e.raw_os_error().map_or(Errno::EAGAIN, Errno::from_raw);
        return Err(ApiError::sys(
            errno,
            "cannot start the control relay thread",
        ));
    }
    // The program's end is a plain blocking socket without close-on-exec,
    // like a descriptor from open(2).
    let fd = app.into_raw_fd();
    // SAFETY: fd is ours and open.
    unsafe { libc::fcntl(fd, libc::F_SETFD, 0) };
    Ok(fd)
}

/// Whether the socket `key` is a control descriptor's (of any process).
pub fn is_control(key: Key) -> bool {
    lock(&CONNS).contains_key(&key)
}

/// The state of control descriptor `fd`.
pub fn lookup(fd: RawFd) -> Result<Arc<Conn>> {
    let key =
        sys::key(fd).map_err(|_| ApiError::BadFd(format!("{fd} is not an open descriptor")))?;
    let conn = lock(&CONNS).get(&key).cloned().ok_or_else(|| {
        ApiError::BadFd(format!(
            "descriptor {fd} is not a RINA control descriptor from rina_open()"
        ))
    })?;
    if conn.pid != std::process::id() {
        // A child of fork(2): the relay thread that would take the
        // daemon's answers stayed in the parent, so a call here would wait
        // for nothing (and the parent's relay would drop the answer).
        return Err(ApiError::BadFd(format!(
            "control descriptor {fd} was opened by process {} before a fork: \
             a child process must call rina_open() for a descriptor of its own \
             (flow descriptors are shared across fork as usual)",
            conn.pid
        )));
    }
    Ok(conn)
}

impl Conn {
    /// Sends `op`; returns the descriptor its reply will arrive on (readable
    /// once it has).
    pub fn request(&self, op: Op) -> Result<OwnedFd> {
        self.send_request(op).map(|(_, w)| w)
    }

    /// Sends `op`; returns its id and the descriptor of its reply.
    fn send_request(&self, op: Op) -> Result<(u64, OwnedFd)> {
        if self.gone.load(Ordering::SeqCst) {
            return Err(daemon_gone());
        }
        self.forget_abandoned();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (mine, theirs) = sys::seqpacket_pair()?;
        lock(&self.routes).insert(id, theirs);
        let pkt = ctl::encode(&Request { id, op });
        let deadline = Deadline::after(timeout());
        let e = match sys::send_until(self.daemon.as_fd(), &pkt, &[], &deadline) {
            Ok(true) => return Ok((id, mine)),
            Ok(false) => ApiError::Timeout(format!(
                "the daemon did not take the request within {deadline} \
                 (it is alive but does not read its control connection)"
            )),
            Err(Errno::EPIPE | Errno::ECONNRESET) => daemon_gone(),
            Err(e) => ApiError::sys(e, "cannot send a request to the daemon"),
        };
        lock(&self.routes).remove(&id);
        Err(e)
    }

    /// Sends `op` and waits for its reply. A flow descriptor that comes
    /// with it (an accepted flow's) is not close-on-exec, like an
    /// allocated one's and like rlite's.
    pub fn call(&self, op: Op) -> Result<(Reply, Option<OwnedFd>)> {
        let (id, w) = self.send_request(op)?;
        let r = wait_reply(&w, false);
        if matches!(r, Err(ApiError::Timeout(_))) {
            // Nobody will read a late reply: forget where it would go.
            lock(&self.routes).remove(&id);
        }
        r
    }

    /// Forgets the reply routes of calls that gave up (the program closed
    /// a `RINA_F_NOWAIT` descriptor without waiting, or a wait timed
    /// out): no one will read a reply there, and each route holds a
    /// descriptor until the daemon answers, if it ever does.
    pub fn forget_abandoned(&self) {
        let mut routes = lock(&self.routes);
        let ids: Vec<u64> = routes.keys().copied().collect();
        let closed = sys::peers_closed(ids.iter().map(|id| routes[id].as_fd()));
        for (id, gone) in ids.iter().zip(closed) {
            if gone {
                routes.remove(id);
            }
        }
    }

    /// A handle for the program standing for `h` (a request or a flow).
    pub fn new_handle(&self, h: Pending) -> i32 {
        let mut hs = lock(&self.handles);
        loop {
            hs.next = hs.next.checked_add(1).unwrap_or(1);
            let n = hs.next;
            if let std::collections::hash_map::Entry::Vacant(v) = hs.map.entry(n) {
                v.insert(h);
                return n;
            }
        }
    }

    /// How many `RINA_F_NORESP` handles wait for a response.
    pub fn pending_handles(&self) -> usize {
        lock(&self.handles).map.len()
    }

    /// What the program's `h` stands for, forgotten from now on.
    pub fn take_handle(&self, h: i32) -> Result<Pending> {
        lock(&self.handles).map.remove(&h).ok_or_else(|| {
            ApiError::Invalid(format!(
                "no flow request with handle {h} waits for a response on this descriptor"
            ))
        })
    }
}

/// The error of a call on a connection the daemon closed.
fn daemon_gone() -> ApiError {
    ApiError::sys(
        Errno::ECONNRESET,
        "the daemon closed the control connection",
    )
}

/// Receives the reply waiting (or coming) on `w`, bounded by
/// [`timeout`] ([`REPLY_TIMEOUT`]); the daemon's error becomes
/// [`ApiError::Daemon`]. Descriptors arrive close-on-exec only with
/// `cloexec`.
pub fn wait_reply(w: &OwnedFd, cloexec: bool) -> Result<(Reply, Option<OwnedFd>)> {
    let deadline = Deadline::after(timeout());
    let ready = sys::wait_readable(w.as_fd(), deadline.at())
        .map_err(|e| ApiError::sys(e, "poll while waiting for the daemon"))?;
    if !ready {
        return Err(ApiError::Timeout(format!(
            "the daemon did not answer within {deadline}"
        )));
    }
    let mut buf = vec![0u8; MAX_ANSWER];
    let p = sys::recv(w.as_fd(), &mut buf, cloexec)
        .map_err(|e| ApiError::sys(e, "cannot receive the daemon's answer"))?;
    if p.len == 0 {
        return Err(daemon_gone());
    }
    if p.truncated {
        return Err(ApiError::Protocol(
            "the daemon's answer is too large".into(),
        ));
    }
    match ctl::decode::<Message>(&buf[..p.len]) {
        Ok(Message::Reply { result, .. }) => Ok((result?, p.fds.into_iter().next())),
        Ok(Message::FlowRequest(_) | Message::FlowAccepted { .. }) => Err(ApiError::Protocol(
            "a flow request arrived where an answer was expected".into(),
        )),
        Ok(
            Message::Progress { .. }
            | Message::RequestWithdrawn { .. }
            | Message::Unregistered { .. },
        ) => Err(ApiError::Protocol(
            "news of an operation under way arrived where an answer was expected".into(),
        )),
        Err(e) => Err(ApiError::Protocol(format!(
            "the daemon sent a malformed message: {e}"
        ))),
    }
}

/// Reads the next flow request, or flow accepted by the daemon, from the
/// program's control descriptor `fd` (blocking unless the program made it
/// non-blocking; a signal handler without `SA_RESTART` interrupts the wait
/// with `EINTR`). An accepted flow's descriptor is close-on-exec until it
/// is handed to the program ([`Conn::take_handle`] callers clear it).
pub fn next_request(fd: RawFd) -> Result<Arrival> {
    let mut buf = vec![0u8; MAX_ANSWER];
    // SAFETY: the caller checked that fd is an open control descriptor; it
    // is only borrowed for this call.
    let bfd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    let p = sys::recv_interruptible(bfd, &mut buf, true)
        .map_err(|e| ApiError::sys(e, "cannot read a flow request"))?;
    if p.len == 0 {
        return Err(daemon_gone());
    }
    if p.truncated {
        return Err(ApiError::Protocol("a flow request is too large".into()));
    }
    let msg = ctl::decode::<Message>(&buf[..p.len])
        .map_err(|e| ApiError::Protocol(format!("malformed flow request: {e}")))?;
    match (msg, p.fds.into_iter().next()) {
        (Message::FlowRequest(req), _) => Ok(Arrival::Request(req)),
        (Message::FlowAccepted { flow: info, .. }, Some(flow)) => {
            Ok(Arrival::Accepted(info, flow))
        }
        // The relay passes on only flows with their descriptor: this one
        // was dropped by the kernel on the way in (the flow is closed).
        (Message::FlowAccepted { flow: info, .. }, None) => Err(ApiError::sys(
            Errno::EMFILE,
            format!(
                "the descriptor of flow {} from {}, accepted by the daemon, could not be received (RLIMIT_NOFILE)",
                info.port, info.remote
            ),
        )),
        _ => Err(ApiError::Protocol(
            "the control relay passed on something other than a flow request".into(),
        )),
    }
}

/// Why a relay stopped relaying.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    /// The program closed its control descriptor.
    ProgramClosed,
    /// The daemon closed the connection (or it failed).
    DaemonGone,
}

/// The relay thread of one control descriptor (see the module's text).
fn relay(conn: Arc<Conn>, app: OwnedFd, key: Key) {
    let mut buf = vec![0u8; MAX_CTL_MSG];
    if relay_loop(&conn, &app, &mut buf) == Ended::DaemonGone {
        conn.gone.store(true, Ordering::SeqCst);
        // Calls still waiting see their socket pair close.
        lock(&conn.routes).clear();
        // The program reads end-of-file on its descriptor (and polls it
        // readable); later calls on it fail with ECONNRESET. The entry stays
        // until the program closes the descriptor, so the number is not
        // mistaken for another descriptor meanwhile.
        let _ = socket::shutdown(app.as_raw_fd(), socket::Shutdown::Write);
        wait_program_close(&app, &mut buf);
    }
    lock(&CONNS).remove(&key);
    lock(&conn.routes).clear();
}

/// Relays until the program or the daemon closes its end.
fn relay_loop(conn: &Conn, app: &OwnedFd, buf: &mut [u8]) -> Ended {
    let mut held: VecDeque<Held> = VecDeque::new();
    loop {
        let app_events = if held.is_empty() {
            PollFlags::POLLIN
        } else {
            PollFlags::POLLIN | PollFlags::POLLOUT
        };
        let mut fds = [
            PollFd::new(conn.daemon.as_fd(), PollFlags::POLLIN),
            PollFd::new(app.as_fd(), app_events),
        ];
        match nix::poll::poll(&mut fds, PollTimeout::NONE) {
            Err(Errno::EINTR) => continue,
            Err(_) => return Ended::DaemonGone,
            Ok(_) => {}
        }
        let daemon_ev = fds[0].revents().unwrap_or(PollFlags::empty());
        let app_ev = fds[1].revents().unwrap_or(PollFlags::empty());
        if app_ev.intersects(PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR)
            && program_closed(app, buf)
        {
            return Ended::ProgramClosed;
        }
        while let Some(front) = held.front() {
            let fds: Vec<RawFd> = front.fd.iter().map(|f| f.as_raw_fd()).collect();
            match sys::send(app.as_fd(), &front.bytes, &fds, true) {
                Ok(()) => {
                    held.pop_front();
                }
                Err(_) => break,
            }
        }
        if daemon_ev.intersects(PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR)
            && !from_daemon(conn, app, &mut held, buf)
        {
            return Ended::DaemonGone;
        }
    }
}

/// Waits until the program closes its end.
fn wait_program_close(app: &OwnedFd, buf: &mut [u8]) {
    loop {
        let mut fds = [PollFd::new(app.as_fd(), PollFlags::POLLIN)];
        match nix::poll::poll(&mut fds, PollTimeout::NONE) {
            Err(Errno::EINTR) => continue,
            Err(_) => return,
            Ok(_) => {}
        }
        if program_closed(app, buf) {
            return;
        }
    }
}

/// Reads what the program wrote on its end (nothing is expected): true if
/// it closed the descriptor.
fn program_closed(app: &OwnedFd, buf: &mut [u8]) -> bool {
    match sys::recv(app.as_fd(), buf, true) {
        Ok(p) => p.len == 0,
        Err(Errno::EAGAIN) => false,
        Err(_) => true,
    }
}

/// Sends `h` to the program's descriptor, or holds it behind those held
/// already; past [`MAX_HELD_REQUESTS`] it is dropped.
fn pass_on(app: &OwnedFd, held: &mut VecDeque<Held>, h: Held) {
    if held.is_empty() {
        let fds: Vec<RawFd> = h.fd.iter().map(|f| f.as_raw_fd()).collect();
        if sys::send(app.as_fd(), &h.bytes, &fds, true).is_ok() {
            return;
        }
    }
    if held.len() < MAX_HELD_REQUESTS {
        held.push_back(h);
    }
}

/// Handles one message from the daemon; false once the daemon is gone.
fn from_daemon(conn: &Conn, app: &OwnedFd, held: &mut VecDeque<Held>, buf: &mut [u8]) -> bool {
    let p = match sys::recv(conn.daemon.as_fd(), buf, true) {
        Ok(p) if p.len > 0 && !p.truncated => p,
        Err(Errno::EAGAIN) => return true,
        _ => return false,
    };
    match ctl::decode::<Message>(&buf[..p.len]) {
        // Without its descriptor (this process is at its limit of open
        // descriptors) an accepted flow is already closed: nothing to pass.
        Ok(Message::FlowAccepted { .. }) if p.fds.is_empty() => {}
        Ok(m @ (Message::FlowRequest(_) | Message::FlowAccepted { .. })) => {
            let handle = match &m {
                Message::FlowRequest(req) => Some(req.handle),
                _ => None,
            };
            let h = Held {
                bytes: ctl::encode(&m),
                fd: p.fds.into_iter().next().filter(|_| handle.is_none()),
                handle,
            };
            pass_on(app, held, h);
        }
        // Only management operations this API does not ask for send it.
        Ok(Message::Progress { .. }) => {}
        // Not handed to the application yet: it never sees it. (One it
        // has fails its accept with `request_gone`, which
        // `rina_flow_accept` passes over.)
        // rlite has no such news: the program keeps waiting, as it would
        // there after `rlite-ctl` withdrew its name.
        Ok(Message::Unregistered { .. }) => {}
        Ok(Message::RequestWithdrawn { handle }) => {
            held.retain(|h| h.handle != Some(handle));
            // A RINA_F_NORESP handle the program never answers is not kept
            // for ever: respond() would fail on it all the same (EINVAL).
            lock(&conn.handles)
                .map
                .retain(|_, h| !matches!(h, Pending::Request(r) if *r == handle));
        }
        Ok(Message::Reply { id, .. }) => {
            let route = lock(&conn.routes).remove(&id);
            if let Some(w) = route {
                let fds: Vec<RawFd> = p.fds.iter().map(|f| f.as_raw_fd()).collect();
                // The waiter may have given up (its end is closed): then the
                // reply and its descriptor are dropped here.
                let _ = sys::send(w.as_fd(), &buf[..p.len], &fds, true);
            }
        }
        // Not ours to understand: ignored, like the Rust client does.
        Err(_) => {}
    }
    true
}
