//! The running gateway: a thread per mapping (a TCP listener, or a
//! registration taking flow requests), a thread pair per session, and a
//! limit on sessions at once. What happens is said on standard error, a
//! line per session (a standard error that went away silences it, nothing
//! more); the mappings that are ready, on standard output.

use super::mapping::{RinaToTcp, TcpToRina};
use super::session::{self, Carried};
use crate::ip::backoff::Backoff;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use rina::{AppName, Client, ErrorKind, Flow, IncomingFlow, QosSpec};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{mpsc, Arc};
use std::time::Duration;

/// Writes a line to standard error, `rina-gw: ` first; an error (a closed
/// pipe) is ignored: the gateway serves on without its log.
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::gw::run::say_line(format_args!($($arg)*))
    };
}

/// The body of [`say!`].
pub fn say_line(what: std::fmt::Arguments<'_>) {
    let _ = writeln!(io::stderr().lock(), "rina-gw: {what}");
}

/// What every mapping of one gateway shares.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The daemon's socket (`None`: the default).
    pub socket: Option<PathBuf>,
    /// This gateway's name, the source of the flows it allocates.
    pub name: AppName,
    /// What the flows it allocates ask for.
    pub qos: QosSpec,
    /// Ask for shared-memory rings where the DIF offers them.
    pub rings: bool,
    /// Most sessions at once, over all mappings.
    pub max_sessions: usize,
    /// How long a TCP connection for a flow request may take.
    pub connect_timeout: Duration,
}

/// The gateway's sessions: how many are up, and a number for each.
#[derive(Debug, Default)]
pub struct Sessions {
    up: AtomicUsize,
    next: AtomicU64,
}

/// A session's place among the [`Sessions`], given back when dropped
/// (whatever ends the session, a panic included).
#[derive(Debug)]
pub struct Place {
    sessions: Arc<Sessions>,
    /// The session's number.
    pub id: u64,
}

impl Drop for Place {
    fn drop(&mut self) {
        self.sessions.up.fetch_sub(1, Relaxed);
    }
}

impl Sessions {
    /// Takes a place if fewer than `most` are up.
    pub fn open(self: &Arc<Self>, most: usize) -> Option<Place> {
        self.up
            .fetch_update(Relaxed, Relaxed, |n| (n < most).then_some(n + 1))
            .ok()?;
        Some(Place {
            sessions: Arc::clone(self),
            id: self.next.fetch_add(1, Relaxed) + 1,
        })
    }

    /// Sessions up now.
    pub fn up(&self) -> usize {
        self.up.load(Relaxed)
    }
}

fn connect(s: &Settings) -> rina::Result<Client> {
    let mut c = crate::opts::connect(s.socket.as_deref())?;
    c.set_rings(s.rings);
    Ok(c)
}

/// Carries the session of `place` (described by `what`) on a thread of
/// its own; the place is given back when it ends.
fn spawn_session(place: Place, what: String, tcp: TcpStream, flow: Flow) {
    let id = place.id;
    let run = move || {
        say!("session {id} up: {what} (flow {})", flow.info().port);
        match session::carry(tcp, flow) {
            Ok(Carried {
                to_rina,
                from_rina,
                error,
            }) => {
                let why = error.map_or(String::new(), |e| format!(" ({e})"));
                say!("session {id} closed: {to_rina} B to RINA, {from_rina} B from RINA{why}");
            }
            Err(e) => say!("session {id} failed: {e}"),
        }
        drop(place);
    };
    let started = std::thread::Builder::new()
        .name(format!("rina-gw-{id}"))
        .spawn(run);
    if let Err(e) = started {
        // The closure, with the place, the connection and the flow, is
        // gone with it.
        say!("session {id}: cannot start a thread: {e}");
    }
}

/// Listens on `m.listen` (already bound as `listener`) for ever: each
/// connection gets a flow to `m.app`, allocated on a thread of its own so
/// that a slow allocation holds up no other connection; a connection
/// beyond the limit, or whose allocation fails, is closed.
pub fn tcp_to_rina(s: Arc<Settings>, sessions: Arc<Sessions>, m: TcpToRina, listener: TcpListener) {
    for tcp in listener.incoming() {
        let tcp = match tcp {
            Ok(t) => t,
            Err(e) => {
                // Out of descriptors, say: the next may work.
                say!("accepting on {}: {e}", m.listen);
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        let from = tcp
            .peer_addr()
            .map_or_else(|_| "?".into(), |a| a.to_string());
        let Some(place) = sessions.open(s.max_sessions) else {
            say!(
                "{from} -> {}: closed, {} sessions are up (--max-sessions)",
                m.app,
                s.max_sessions
            );
            continue;
        };
        let (s, app, dif) = (Arc::clone(&s), m.app.clone(), m.dif.clone());
        let id = place.id;
        let allocate = move || match connect(&s)
            .and_then(|mut c| c.allocate(&s.name, &app, dif.as_deref(), &s.qos))
        {
            Ok(flow) => spawn_session(place, format!("{from} -> {app}"), tcp, flow),
            Err(e) => say!("session {id}: {from} -> {app}: cannot allocate a flow: {e}"),
        };
        if let Err(e) = std::thread::Builder::new().spawn(allocate) {
            say!("session {id}: cannot start a thread: {e}");
        }
    }
}

/// Connects to the daemon and registers `m.app` for a RINA-to-TCP
/// mapping: the client that takes its requests.
pub fn register(s: &Settings, m: &RinaToTcp) -> rina::Result<Client> {
    let mut c = connect(s)?;
    c.register(&m.app, m.dif.as_deref())?;
    Ok(c)
}

/// Serves the flow requests for `m.app` (registered through `client`)
/// until its name is withdrawn: returns that error. A daemon that goes
/// away is waited for, and the name registered again when it is back
/// (after 1 s, then twice as long each time, at most 30 s apart).
pub fn rina_to_tcp(
    s: Arc<Settings>,
    sessions: Arc<Sessions>,
    m: RinaToTcp,
    mut client: Client,
) -> rina::Error {
    let mut backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(30));
    loop {
        let e = serve(&s, &sessions, &m, &mut client);
        if e.kind() == ErrorKind::NotRegistered {
            return e;
        }
        say!("{}: {e}; registering it again", m.app);
        // The old connection goes first: where the daemon is still there,
        // it holds the name, which a new registration would find taken.
        drop(client);
        client = loop {
            std::thread::sleep(backoff.next_base());
            match register(&s, &m) {
                Ok(c) => break c,
                Err(e) if e.kind() == ErrorKind::NotRegistered => return e,
                Err(_) => {}
            }
        };
        backoff.reset();
        say!("{} registered again", m.app);
    }
}

/// A flow request whose TCP connection was tried: the request, its place
/// and the connection (or why there is none).
type Tried = (IncomingFlow, Place, io::Result<TcpStream>);

/// Takes the flow requests for `m.app` until the client fails: each is
/// given a place and a TCP connection to `m.connect`, tried on a thread of
/// its own so that a slow server holds up no other request, then accepted,
/// or refused with the reason. Returns the client's error.
fn serve(
    s: &Settings,
    sessions: &Arc<Sessions>,
    m: &RinaToTcp,
    client: &mut Client,
) -> rina::Error {
    let (tx, rx) = mpsc::channel::<Tried>();
    let (mut bell, ring) = match UnixStream::pair().and_then(|(r, w)| {
        r.set_nonblocking(true)?;
        Ok((r, w))
    }) {
        Ok(p) => p,
        Err(e) => return rina::Error::new(ErrorKind::Internal, format!("a socket pair: {e}")),
    };
    loop {
        // The bell first, then what it rang for: a connection tried after
        // this rings again, so the wait below cannot miss it.
        let mut b = [0u8; 64];
        while bell.read(&mut b).is_ok_and(|n| n > 0) {}
        // Answers before requests: an answer is a call to the daemon, and
        // what the daemon sends meanwhile (a request, a withdrawal) waits
        // in the client, where the wait below would not see it; the loop
        // below takes it, and nothing talks to the daemon after it.
        while let Ok(tried) = rx.try_recv() {
            answer(m, client, tried);
        }
        loop {
            match client.next_request_timeout(Duration::ZERO) {
                Ok(Some(req)) => try_connect(s, sessions, m, client, req, &tx, &ring),
                Ok(None) => break,
                Err(e) => return e,
            }
        }
        let mut fds = [
            PollFd::new(client.as_fd(), PollFlags::POLLIN),
            PollFd::new(bell.as_fd(), PollFlags::POLLIN),
        ];
        if let Err(e) = poll(&mut fds, PollTimeout::NONE) {
            if e != nix::errno::Errno::EINTR {
                return rina::Error::new(ErrorKind::Internal, format!("poll: {e}"));
            }
        }
    }
}

/// Gives request `req` a place and starts its TCP connection on a thread
/// that sends the outcome on `tx` and rings `ring`; refuses it at once if
/// no place is free or no thread starts.
fn try_connect(
    s: &Settings,
    sessions: &Arc<Sessions>,
    m: &RinaToTcp,
    client: &mut Client,
    req: IncomingFlow,
    tx: &mpsc::Sender<Tried>,
    ring: &UnixStream,
) {
    let Some(place) = sessions.open(s.max_sessions) else {
        refuse(
            m,
            client,
            &req,
            format!("{} sessions are up", s.max_sessions),
        );
        return;
    };
    let (to, timeout, tx) = (m.connect, s.connect_timeout, tx.clone());
    let ring = match ring.try_clone() {
        Ok(r) => r,
        Err(e) => return refuse(m, client, &req, format!("cannot start a connection: {e}")),
    };
    let (req2, started) = (req.clone(), std::thread::Builder::new());
    let started = started.spawn(move || {
        let tcp = TcpStream::connect_timeout(&to, timeout);
        if tx.send((req2, place, tcp)).is_ok() {
            let _ = (&ring).write(&[1]);
        }
    });
    if let Err(e) = started {
        refuse(m, client, &req, format!("cannot start a connection: {e}"));
    }
}

/// Accepts the request of `tried` if its connection is up (the session
/// starts), or refuses it with the reason.
fn answer(m: &RinaToTcp, client: &mut Client, (req, place, tcp): Tried) {
    let tcp = match tcp {
        Ok(t) => t,
        Err(e) => return refuse(m, client, &req, describe(m.connect, &e)),
    };
    match client.accept(&req) {
        Ok(flow) => {
            let what = format!("{} -> {} -> {}", req.remote, m.app, m.connect);
            spawn_session(place, what, tcp, flow);
        }
        // Withdrawn meanwhile (its requester gave up), say.
        Err(e) => say!("{} -> {}: cannot accept: {e}", req.remote, m.app),
    }
}

fn describe(to: SocketAddr, e: &io::Error) -> String {
    format!("cannot connect to {to}: {e}")
}

/// Refuses `req`, saying why (to the requester, and here).
fn refuse(m: &RinaToTcp, client: &mut Client, req: &IncomingFlow, why: String) {
    let why = format!("rina-gw: {why}");
    say!("{} -> {}: refused: {why}", req.remote, m.app);
    if let Err(e) = client.refuse(req, &why) {
        say!("{} -> {}: cannot refuse: {e}", req.remote, m.app);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::socket::{recv, send, socketpair, AddressFamily, MsgFlags, SockFlag, SockType};
    use rina_wire::ctl::{self, CtlError, Message, Op, Request};
    use std::os::fd::{AsRawFd, OwnedFd};

    /// What a fake daemon's end of a control connection receives next,
    /// within `ms` milliseconds.
    fn next_request(fd: &OwnedFd, ms: u16) -> Option<Request> {
        let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
        if poll(&mut fds, PollTimeout::from(ms)).ok()? == 0 {
            return None;
        }
        let mut buf = vec![0u8; ctl::MAX_CTL_MSG];
        let n = recv(fd.as_raw_fd(), &mut buf, MsgFlags::empty()).ok()?;
        ctl::decode(&buf[..n]).ok()
    }

    fn tell(fd: &OwnedFd, m: &Message) {
        send(fd.as_raw_fd(), &ctl::encode(m), MsgFlags::empty()).unwrap();
    }

    fn request(handle: u64) -> Message {
        Message::FlowRequest(IncomingFlow {
            handle,
            dif: "net".into(),
            local: "web".parse().unwrap(),
            remote: "peer".parse().unwrap(),
            qos: QosSpec::default(),
        })
    }

    /// The fake daemon answers accepting request `handle` with "gone".
    fn gone(fd: &OwnedFd, handle: u64, send_first: Option<&Message>) {
        let r = next_request(fd, 5000).expect("an answer to the request");
        assert!(
            matches!(r.op, Op::Accept { handle: h, .. } if h == handle),
            "{r:?}"
        );
        // What the daemon sends while the gateway waits for its reply.
        if let Some(m) = send_first {
            tell(fd, m);
        }
        let err = CtlError::new(ErrorKind::RequestGone, "withdrawn");
        tell(
            fd,
            &Message::Reply {
                id: r.id,
                result: Err(err),
            },
        );
    }

    /// A request, or a withdrawal of the name, that comes while the
    /// gateway waits for the daemon's reply to an answer is not left in
    /// the client while the gateway waits on the connection: the request
    /// is answered, and the withdrawal ends the mapping.
    #[test]
    fn what_comes_during_an_answer_is_not_left_waiting() {
        let (ours, daemon) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .unwrap();
        let server = TcpListener::bind("127.0.0.1:0").unwrap();
        let s = Arc::new(Settings {
            socket: None,
            name: "gw".parse().unwrap(),
            qos: QosSpec::default(),
            rings: false,
            max_sessions: 8,
            connect_timeout: Duration::from_secs(1),
        });
        let m = RinaToTcp {
            app: "web".parse().unwrap(),
            connect: server.local_addr().unwrap(),
            dif: None,
        };
        let client = Client::from_fd(ours);
        let (done_tx, done) = mpsc::channel();
        std::thread::spawn(move || {
            let e = rina_to_tcp(s, Arc::new(Sessions::default()), m, client);
            let _ = done_tx.send(e.kind());
        });
        tell(&daemon, &request(1));
        gone(&daemon, 1, Some(&request(2)));
        let unregistered = Message::Unregistered {
            name: "web".parse().unwrap(),
            dif: "net".into(),
        };
        gone(&daemon, 2, Some(&unregistered));
        assert_eq!(
            done.recv_timeout(Duration::from_secs(5)),
            Ok(ErrorKind::NotRegistered),
            "the withdrawal did not end the mapping"
        );
    }

    #[test]
    fn sessions_beyond_the_limit_get_no_place_until_one_is_given_back() {
        let s = Arc::new(Sessions::default());
        let (a, b) = (s.open(2).unwrap(), s.open(2).unwrap());
        assert_eq!((a.id, b.id), (1, 2));
        assert!(s.open(2).is_none(), "a third of two");
        assert_eq!(s.up(), 2);
        drop(a);
        assert_eq!(s.open(2).map(|p| p.id), Some(3), "numbers are not reused");
        // The third place was dropped at once: one is up.
        assert_eq!(s.up(), 1);
        // A place is given back by a thread that panics too.
        let p = s.open(2).unwrap();
        let _ = std::thread::spawn(move || {
            let _p = p;
            panic!("a session that panics");
        })
        .join();
        assert_eq!(s.up(), 1);
    }
}
