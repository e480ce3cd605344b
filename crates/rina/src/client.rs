//! The control connection to `rinad`.

use crate::error::{Error, ErrorKind, Result};
use crate::flow::Flow;
use crate::sock;
use nix::errno::Errno;
use nix::sys::socket::{self, AddressFamily, SockFlag, SockType, UnixAddr};
use rina_wire::ctl::{
    self, DifInfo, FlowStats, IncomingFlow, IpcpInfo, Message, NameInfo, Op, Reply, Request,
    MAX_CTL_MSG,
};
use rina_wire::{AppName, QosSpec};
use std::collections::VecDeque;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A connection to the local RINA daemon.
///
/// Every method is blocking. From async code, run them in
/// `tokio::task::spawn_blocking` (the flows they return can be turned into
/// [`AsyncFlow`](crate::AsyncFlow)s). A [`Client`] is `Send`, so it can be
/// moved into the blocking task and back.
///
/// Flow requests for names this connection registered arrive at any time;
/// while a method waits for its own reply they are queued and later handed
/// out by [`Client::next_request`].
#[derive(Debug)]
pub struct Client {
    sock: OwnedFd,
    path: PathBuf,
    next_id: u64,
    pending: VecDeque<IncomingFlow>,
    buf: Vec<u8>,
}

impl Client {
    /// Connects to the daemon at [`ctl::default_socket_path`] (which honours
    /// the `RINA_SOCKET` environment variable).
    pub fn connect() -> Result<Client> {
        Client::connect_to(ctl::default_socket_path())
    }

    /// Connects to the daemon listening on `path`.
    ///
    /// Fails with [`ErrorKind::DaemonNotRunning`] if nothing listens there.
    pub fn connect_to(path: impl AsRef<Path>) -> Result<Client> {
        let path = path.as_ref();
        let not_running = || {
            Error::new(
                ErrorKind::DaemonNotRunning,
                format!(
                    "no RINA daemon listens on {} (is rinad running? the socket can be set with --socket or {})",
                    path.display(),
                    ctl::SOCKET_ENV
                ),
            )
        };
        let addr = UnixAddr::new(path).map_err(|e| {
            Error::new(
                ErrorKind::InvalidRequest,
                format!("bad socket path {}: {}", path.display(), e.desc()),
            )
        })?;
        let fd = socket::socket(
            AddressFamily::Unix,
            SockType::SeqPacket,
            SockFlag::SOCK_CLOEXEC,
            None,
        )
        .map_err(|e| Error::sys("cannot create a control socket", e))?;
        loop {
            match socket::connect(fd.as_raw_fd(), &addr) {
                Ok(()) => break,
                Err(Errno::EINTR) => continue,
                Err(Errno::ENOENT | Errno::ECONNREFUSED | Errno::ENOTDIR) => {
                    return Err(not_running())
                }
                Err(e) => {
                    return Err(Error::sys(
                        &format!("cannot connect to the daemon at {}", path.display()),
                        e,
                    ))
                }
            }
        }
        let mut c = Client::from_fd(fd);
        c.path = path.to_owned();
        Ok(c)
    }

    /// Wraps an already connected control socket (socket activation, tests).
    pub fn from_fd(fd: OwnedFd) -> Client {
        Client {
            sock: fd,
            path: PathBuf::new(),
            next_id: 1,
            pending: VecDeque::new(),
            buf: Vec::new(),
        }
    }

    /// The socket path this client connected to (empty for [`Client::from_fd`]).
    pub fn socket_path(&self) -> &Path {
        &self.path
    }

    /// Registers `name` in `dif`, or in every DIF without one; returns the DIFs
    /// it was registered in. Flow requests for it arrive on this connection;
    /// registrations end when it closes.
    pub fn register(&mut self, name: &AppName, dif: Option<&str>) -> Result<Vec<String>> {
        let op = Op::Register {
            name: name.clone(),
            dif: dif.map(str::to_owned),
        };
        match self.call(op)? {
            (Reply::Registered { difs }, _) => Ok(difs),
            (Reply::Done, _) => Ok(dif.map(|d| vec![d.to_owned()]).unwrap_or_default()),
            (other, _) => Err(unexpected("register", &other)),
        }
    }

    /// Withdraws a registration from `dif`, or from every DIF without one.
    pub fn unregister(&mut self, name: &AppName, dif: Option<&str>) -> Result<()> {
        let op = Op::Unregister {
            name: name.clone(),
            dif: dif.map(str::to_owned),
        };
        self.call(op).map(|_| ())
    }

    /// Allocates a flow from `local` to `remote` in `dif` (or a DIF the daemon
    /// chooses). Blocks while the daemon asks the peer; the daemon answers with
    /// [`ErrorKind::Timeout`] if the peer stays silent.
    pub fn allocate(
        &mut self,
        local: &AppName,
        remote: &AppName,
        dif: Option<&str>,
        qos: &QosSpec,
    ) -> Result<Flow> {
        let op = Op::Allocate {
            local: local.clone(),
            remote: remote.clone(),
            dif: dif.map(str::to_owned),
            qos: *qos,
        };
        let r = self.call(op)?;
        flow_from("allocate", r)
    }

    /// Waits for the next flow request to a name this connection registered.
    pub fn next_request(&mut self) -> Result<IncomingFlow> {
        loop {
            if let Some(r) = self.next_request_timeout(Duration::from_secs(3600))? {
                return Ok(r);
            }
        }
    }

    /// Like [`Client::next_request`], but gives up after `timeout` with `None`.
    pub fn next_request_timeout(&mut self, timeout: Duration) -> Result<Option<IncomingFlow>> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(r) = self.pending.pop_front() {
                return Ok(Some(r));
            }
            match self.recv(Some(deadline))? {
                None => return Ok(None),
                Some((Message::FlowRequest(r), _)) => return Ok(Some(r)),
                // A reply nobody waits for (its caller gave up): dropped,
                // with any descriptor it carried.
                Some((Message::Reply { .. }, _)) => {}
            }
        }
    }

    /// The flow requests received but not yet handed out.
    pub fn pending_requests(&self) -> usize {
        self.pending.len()
    }

    /// Accepts a flow request; returns the flow.
    pub fn accept(&mut self, req: &IncomingFlow) -> Result<Flow> {
        let r = self.call(Op::Accept { handle: req.handle })?;
        flow_from("accept", r)
    }

    /// Refuses a flow request; `reason` is passed to the requester.
    pub fn refuse(&mut self, req: &IncomingFlow, reason: &str) -> Result<()> {
        self.call(Op::Refuse {
            handle: req.handle,
            reason: reason.to_owned(),
        })
        .map(|_| ())
    }

    /// Lists the daemon's IPC processes.
    pub fn list_ipcps(&mut self) -> Result<Vec<IpcpInfo>> {
        match self.call(Op::ListIpcps)? {
            (Reply::Ipcps { ipcps }, _) => Ok(ipcps),
            (other, _) => Err(unexpected("list_ipcps", &other)),
        }
    }

    /// Lists the daemon's DIFs.
    pub fn list_difs(&mut self) -> Result<Vec<DifInfo>> {
        match self.call(Op::ListDifs)? {
            (Reply::Difs { difs }, _) => Ok(difs),
            (other, _) => Err(unexpected("list_difs", &other)),
        }
    }

    /// Lists the registered application names.
    pub fn list_names(&mut self) -> Result<Vec<NameInfo>> {
        match self.call(Op::ListNames)? {
            (Reply::Names { names }, _) => Ok(names),
            (other, _) => Err(unexpected("list_names", &other)),
        }
    }

    /// Lists the flows and their counters.
    pub fn list_flows(&mut self) -> Result<Vec<FlowStats>> {
        match self.call(Op::ListFlows)? {
            (Reply::Flows { flows }, _) => Ok(flows),
            (other, _) => Err(unexpected("list_flows", &other)),
        }
    }

    /// Sends `op` and waits for its reply, queueing flow requests meanwhile.
    /// Returns the reply and the descriptor attached to it, if any.
    fn call(&mut self, op: Op) -> Result<(Reply, Option<OwnedFd>)> {
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1);
        let pkt = ctl::encode(&Request { id, op });
        if pkt.len() > MAX_CTL_MSG {
            return Err(Error::new(
                ErrorKind::InvalidRequest,
                format!(
                    "request is {} bytes, the control protocol allows {MAX_CTL_MSG}",
                    pkt.len()
                ),
            ));
        }
        sock::send(self.sock.as_fd(), &pkt, &[]).map_err(|e| self.lost("send a request", e))?;
        loop {
            match self.recv(None)? {
                None => continue,
                Some((Message::FlowRequest(r), _)) => self.pending.push_back(r),
                Some((Message::Reply { id: rid, result }, fd)) if rid == id => {
                    return Ok((result?, fd))
                }
                Some((Message::Reply { .. }, _)) => {}
            }
        }
    }

    /// Receives one message, waiting until `deadline` (forever without one).
    fn recv(&mut self, deadline: Option<Instant>) -> Result<Option<(Message, Option<OwnedFd>)>> {
        if let Some(d) = deadline {
            let left = d.saturating_duration_since(Instant::now());
            let ready = sock::wait_readable(self.sock.as_fd(), Some(left))
                .map_err(|e| Error::sys("poll on the control socket", e))?;
            if !ready {
                return Ok(None);
            }
        }
        if self.buf.len() < MAX_CTL_MSG {
            self.buf.resize(MAX_CTL_MSG, 0);
        }
        let p = sock::recv(self.sock.as_fd(), &mut self.buf)
            .map_err(|e| self.lost("receive from the daemon", e))?;
        if p.len == 0 {
            return Err(self.gone());
        }
        if p.truncated {
            return Err(Error::new(
                ErrorKind::Internal,
                format!("the daemon sent a control message larger than {MAX_CTL_MSG} bytes"),
            ));
        }
        let msg: Message = ctl::decode(&self.buf[..p.len]).map_err(|e| {
            Error::new(
                ErrorKind::Internal,
                format!("the daemon sent a malformed control message: {e}"),
            )
        })?;
        // The protocol attaches at most one descriptor; extra ones are closed.
        let fd = p.fds.into_iter().next();
        Ok(Some((msg, fd)))
    }

    fn gone(&self) -> Error {
        Error::new(
            ErrorKind::DaemonGone,
            format!("the daemon{} closed the control connection", self.at()),
        )
    }

    fn lost(&self, what: &str, e: Errno) -> Error {
        let err = Error::sys(&format!("cannot {what}{}", self.at()), e);
        if err.kind == ErrorKind::DaemonGone {
            self.gone()
        } else {
            err
        }
    }

    fn at(&self) -> String {
        if self.path.as_os_str().is_empty() {
            String::new()
        } else {
            format!(" at {}", self.path.display())
        }
    }
}

impl AsFd for Client {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }
}

impl AsRawFd for Client {
    fn as_raw_fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }
}

fn flow_from(what: &str, (reply, fd): (Reply, Option<OwnedFd>)) -> Result<Flow> {
    match reply {
        Reply::Flow(info) => match fd {
            Some(fd) => Ok(Flow::from_parts(fd, info)),
            None => Err(Error::new(
                ErrorKind::Internal,
                format!(
                    "the daemon announced flow {} without its descriptor",
                    info.port
                ),
            )),
        },
        other => Err(unexpected(what, &other)),
    }
}

fn unexpected(what: &str, reply: &Reply) -> Error {
    let kind = match reply {
        Reply::Done => "done",
        Reply::Registered { .. } => "registered",
        Reply::Flow(_) => "flow",
        Reply::Ipcps { .. } => "ipcps",
        Reply::Difs { .. } => "difs",
        Reply::Names { .. } => "names",
        Reply::Flows { .. } => "flows",
    };
    Error::new(
        ErrorKind::Internal,
        format!("the daemon answered {what} with an unexpected '{kind}' reply"),
    )
}
