//! The control connection to `rinad`.

use crate::bundle::Bundle;
use crate::error::{Error, ErrorKind, Result};
use crate::flow::Flow;
use crate::sock;
use nix::errno::Errno;
use nix::sys::socket::{self, AddressFamily, SockFlag, SockType, UnixAddr};
use rina_wire::ctl::{
    self, AutoAccept, DifInfo, FlowInfo, FlowStats, IncomingFlow, IpcpInfo, Message, NameInfo, Op,
    Reply, Request, RibObjectInfo, SchedulerInfo, MAX_CTL_MSG,
};
use rina_wire::{AppName, QosSpec};
use std::collections::{BTreeSet, VecDeque};
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
///
/// # Timeouts
///
/// Every control call (connecting, registering, allocating, accepting,
/// listing...) gives up after the client's timeout, [`DEFAULT_TIMEOUT`] unless
/// changed with [`Client::set_timeout`], and fails with
/// [`ErrorKind::Timeout`]: a daemon that is alive but stuck cannot hang the
/// application. The default is well above the daemon's own limits (it
/// answers an allocation the peer ignores with a timeout after 2 s), so it
/// only fires when the daemon itself does not answer. A reply that comes
/// after its call gave up is discarded, with any flow it carried (the daemon
/// then sees the flow closed). [`Client::next_request`] is the exception: it
/// waits for a peer to ask for a flow, which may take forever by design; use
/// [`Client::next_request_timeout`] to bound it.
#[derive(Debug)]
pub struct Client {
    sock: OwnedFd,
    path: PathBuf,
    next_id: u64,
    pending: VecDeque<IncomingFlow>,
    /// Flows the daemon accepted for a registration that asked it to,
    /// not yet handed out ([`Client::next_flow`]), with their descriptors
    /// and whether a rings set-up comes first on them.
    arrived: VecDeque<(FlowInfo, Vec<OwnedFd>, bool)>,
    /// Flows the daemon accepted into a bundle, not yet handed out
    /// ([`Client::next_bundled_flow`]).
    arrived_bundled: VecDeque<FlowInfo>,
    /// The registrations this connection made, as (name, DIF).
    registered: BTreeSet<(AppName, String)>,
    /// Why no registration is left, when another connection (an
    /// administrator) withdrew the last one: flow requests will not come.
    orphaned: Option<String>,
    buf: Vec<u8>,
    timeout: Option<Duration>,
    /// Ask for shared-memory rings on flows allocated or accepted from now on.
    rings: bool,
    /// Ask for direct UDP data paths on flows allocated or accepted from now on.
    direct: bool,
}

/// How long a control call waits for the daemon unless
/// [`Client::set_timeout`] says otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// Flows the daemon accepted that a client holds without the application
/// having taken them ([`Client::next_flow`]); past this, one that comes
/// while another call reads its answer is closed (deallocated), as the C
/// library's relay does past the same number.
pub const MAX_ARRIVED: usize = 1024;

impl Client {
    /// Connects to the daemon at [`ctl::default_socket_path`] (which honours
    /// the `RINA_SOCKET` environment variable).
    ///
    /// When that is the per-user directory `/tmp/rinad-<uid>`, it must be
    /// this user's own and private (another user could have created it to
    /// pose as the daemon); otherwise this fails with
    /// [`ErrorKind::PermissionDenied`].
    pub fn connect() -> Result<Client> {
        let path = ctl::default_socket_path();
        // SAFETY: geteuid has no preconditions and cannot fail.
        let uid = unsafe { libc::geteuid() };
        let private = ctl::private_socket_dir(uid);
        if path.parent() == Some(private.as_path()) && private.exists() {
            ctl::check_socket_dir(&private, uid, true)
                .map_err(|m| Error::new(ErrorKind::PermissionDenied, m))?;
        }
        Client::connect_to(path)
    }

    /// Connects to the daemon listening on `path`, waiting at most
    /// [`DEFAULT_TIMEOUT`].
    ///
    /// Fails with [`ErrorKind::DaemonNotRunning`] if nothing listens there.
    pub fn connect_to(path: impl AsRef<Path>) -> Result<Client> {
        Client::connect_to_timeout(path, Some(DEFAULT_TIMEOUT))
    }

    /// Connects to the daemon listening on `path`, waiting at most `timeout`
    /// (`None`: no limit) for the daemon to take the connection; the client's
    /// timeout for later calls is set to `timeout` as well.
    ///
    /// Connecting only waits when the daemon's backlog of connections it has
    /// not taken yet is full, which happens when it is stuck; past the
    /// deadline the error is [`ErrorKind::Timeout`].
    pub fn connect_to_timeout(path: impl AsRef<Path>, timeout: Option<Duration>) -> Result<Client> {
        let path = path.as_ref();
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
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
            // A blocking connect to a Unix socket waits only while the
            // listener's backlog is full; the kernel bounds that wait by the
            // socket's send timeout (a non-blocking connect would fail with
            // EAGAIN at once, and cannot be polled for).
            let left = match deadline {
                None => Duration::ZERO,
                Some(d) => match d.checked_duration_since(Instant::now()) {
                    Some(l) if !l.is_zero() => l,
                    _ => return Err(connect_timeout(path, timeout)),
                },
            };
            sock::set_send_timeout(fd.as_fd(), left)
                .map_err(|e| Error::sys("cannot set the control socket's send timeout", e))?;
            match socket::connect(fd.as_raw_fd(), &addr) {
                Ok(()) => break,
                Err(Errno::EINTR) => continue,
                Err(Errno::EAGAIN) if deadline.is_some() => {
                    return Err(connect_timeout(path, timeout))
                }
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
        // Later sends are bounded by poll, not by the socket option.
        sock::set_send_timeout(fd.as_fd(), Duration::ZERO)
            .map_err(|e| Error::sys("cannot reset the control socket's send timeout", e))?;
        let mut c = Client::from_fd(fd);
        c.path = path.to_owned();
        c.timeout = timeout;
        Ok(c)
    }

    /// Wraps an already connected control socket (socket activation, tests).
    /// Its timeout is [`DEFAULT_TIMEOUT`].
    pub fn from_fd(fd: OwnedFd) -> Client {
        Client {
            sock: fd,
            path: PathBuf::new(),
            next_id: 1,
            pending: VecDeque::new(),
            arrived: VecDeque::new(),
            arrived_bundled: VecDeque::new(),
            registered: BTreeSet::new(),
            orphaned: None,
            buf: Vec::new(),
            timeout: Some(DEFAULT_TIMEOUT),
            rings: true,
            direct: false,
        }
    }

    /// Sets how long each control call may wait for the daemon (sending the
    /// request and receiving its reply); `None` waits forever. It does not
    /// apply to [`Client::next_request`].
    pub fn set_timeout(&mut self, timeout: Option<Duration>) {
        self.timeout = timeout;
    }

    /// Whether to ask for shared-memory rings as the data path of the flows
    /// this client allocates or accepts from now on, where the IPCP serving
    /// a flow offers them (rinad does on shim-hv, shim-udp and normal DIFs;
    /// shim-eth and direct flows do not): SDUs then go through two rings in
    /// memory shared with the daemon instead of one system call each on
    /// the flow's socket. On by default. Such a flow is used like any
    /// other: [`Flow::read`], [`Flow::write`] and their variants,
    /// [`Flow::try_read`] with poll/epoll on the descriptor [`AsFd`] gives
    /// (it turns readable when an SDU may be waiting or the flow closed),
    /// or [`Flow::into_async`]. What it does not offer is the socket as a
    /// data path: an application that hands the descriptor to code reading
    /// and writing it directly (another language, `read(2)`/`write(2)`, a
    /// loop waiting for it to turn writable) turns rings off.
    /// [`Flow::has_rings`] tells which flows got them.
    ///
    /// [`AsFd`]: std::os::fd::AsFd
    pub fn set_rings(&mut self, on: bool) {
        self.rings = on;
    }

    /// Asks for a direct data path on the flows this client allocates or
    /// accepts from now on, where the IPCP serving a flow offers one and
    /// the other end asks for it too (shim-udp IPCPs do): the flow's
    /// descriptor is then a UDP socket connected to the other
    /// application's, so SDUs cross no daemon (two process wake-ups per
    /// round trip instead of six), and the daemons count none of them.
    /// The flow still ends when either end closes it: the [`Flow`] holds a
    /// second descriptor, its lifeline to the daemon, and the daemon shuts
    /// the socket down when the other end deallocates (a read then returns
    /// end of file). [`Flow::is_direct`] tells which flows got it; the
    /// others are ordinary flows. Off by default. Rings are not used on a
    /// direct flow.
    pub fn set_direct(&mut self, on: bool) {
        self.direct = on;
    }

    /// The timeout of control calls (see [`Client::set_timeout`]).
    pub fn timeout(&self) -> Option<Duration> {
        self.timeout
    }

    /// The socket path this client connected to (empty for [`Client::from_fd`]).
    pub fn socket_path(&self) -> &Path {
        &self.path
    }

    /// Registers `name` in `dif`, or in every DIF without one; returns the DIFs
    /// it was registered in. Flow requests for it arrive on this connection;
    /// registrations end when it closes.
    pub fn register(&mut self, name: &AppName, dif: Option<&str>) -> Result<Vec<String>> {
        self.register_with(name, dif, None)
    }

    /// Registers `name` as [`Client::register`] does, but has the daemon
    /// accept every flow request for it at once, with the data path this
    /// client asks for ([`Client::set_rings`], [`Client::set_direct`]), as
    /// a listening TCP socket's backlog does: an allocation to `name` then
    /// waits for no round trip to this application, and
    /// [`Client::next_flow`] hands the flows over. The daemon keeps at
    /// most a bounded number of flows and news unread on a connection;
    /// past that it refuses further requests, saying that the application
    /// does not read them. Other calls read the flows sent before their
    /// answers; this client holds [`MAX_ARRIVED`] of them at most and
    /// closes those past it. Flows accepted before an unregistration are
    /// still handed over, with the data path asked for when they came.
    pub fn register_accepting(&mut self, name: &AppName, dif: Option<&str>) -> Result<Vec<String>> {
        let accept = AutoAccept {
            rings: self.rings,
            direct: self.direct,
            bundle: None,
        };
        self.register_with(name, dif, Some(accept))
    }

    fn register_with(
        &mut self,
        name: &AppName,
        dif: Option<&str>,
        accept: Option<AutoAccept>,
    ) -> Result<Vec<String>> {
        let op = Op::Register {
            name: name.clone(),
            dif: dif.map(str::to_owned),
            accept,
        };
        let difs = match self.call("register", op)? {
            (Reply::Registered { difs }, _) => difs,
            (Reply::Done, _) => dif.map(|d| vec![d.to_owned()]).unwrap_or_default(),
            (other, _) => return Err(unexpected("register", &other)),
        };
        for d in &difs {
            self.registered.insert((name.clone(), d.clone()));
        }
        self.orphaned = None;
        Ok(difs)
    }

    /// Withdraws a registration from `dif`, or from every DIF without one.
    pub fn unregister(&mut self, name: &AppName, dif: Option<&str>) -> Result<()> {
        let op = Op::Unregister {
            name: name.clone(),
            dif: dif.map(str::to_owned),
        };
        self.call("unregister", op)?;
        self.registered
            .retain(|(n, d)| !(n == name && dif.is_none_or(|x| x == d)));
        Ok(())
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
            rings: self.rings,
            direct: self.direct,
            bundle: None,
        };
        let r = self.call("allocate", op)?;
        flow_from("allocate", r, self.rings)
    }

    /// Waits for the next flow request to a name this connection registered.
    ///
    /// This waits for a peer, not for the daemon, so it has no timeout: it
    /// returns when a request comes or the daemon closes the connection. Use
    /// [`Client::next_request_timeout`] to give up after a while.
    ///
    /// If another connection (an administrator's `rinactl unregister`)
    /// withdraws every name this connection registered, it fails with
    /// [`ErrorKind::NotRegistered`] saying so, since no request will come.
    pub fn next_request(&mut self) -> Result<IncomingFlow> {
        loop {
            if let Some(r) = self.wait_news(None, Self::next_pending)? {
                return Ok(r);
            }
        }
    }

    /// Like [`Client::next_request`], but gives up after `timeout` with `None`.
    pub fn next_request_timeout(&mut self, timeout: Duration) -> Result<Option<IncomingFlow>> {
        // A timeout too large to add is no timeout.
        let deadline = Instant::now().checked_add(timeout);
        self.wait_news(deadline, Self::next_pending)
    }

    /// Reads what the daemon sends until `take` finds what is waited for
    /// in it, or `deadline` (none: no limit) passes (`None`); fails once
    /// every name this connection registered is withdrawn.
    fn wait_news<T>(
        &mut self,
        deadline: Option<Instant>,
        take: impl Fn(&mut Self) -> Result<Option<T>>,
    ) -> Result<Option<T>> {
        loop {
            if let Some(t) = take(self)? {
                return Ok(Some(t));
            }
            self.check_orphaned()?;
            match self.recv(deadline)? {
                None => return Ok(None),
                Some(m) => self.news(m),
            }
        }
    }

    /// Waits for the next flow the daemon accepted for a name this
    /// connection registered with [`Client::register_accepting`].
    ///
    /// Like [`Client::next_request`], this waits for a peer and has no
    /// timeout; [`Client::next_flow_timeout`] gives up after a while. It
    /// fails with [`ErrorKind::NotRegistered`] once another connection has
    /// withdrawn every name this connection registered.
    pub fn next_flow(&mut self) -> Result<Flow> {
        loop {
            if let Some(f) = self.wait_news(None, Self::next_arrived)? {
                return f;
            }
        }
    }

    /// Like [`Client::next_flow`], but gives up after `timeout` with `None`.
    pub fn next_flow_timeout(&mut self, timeout: Duration) -> Result<Option<Flow>> {
        let deadline = Instant::now().checked_add(timeout);
        self.wait_news(deadline, Self::next_arrived)?.transpose()
    }

    /// The flows the daemon accepted that are received but not yet handed
    /// out.
    pub fn accepted_flows(&self) -> usize {
        self.arrived.len()
    }

    /// The first accepted flow queued, made ready (its rings set up). The
    /// socket is read only when none is queued (nothing withdraws an
    /// accepted flow), so that flows this process has not taken stay in
    /// the daemon's bounded queue, not in this one.
    fn next_arrived(&mut self) -> Result<Option<Result<Flow>>> {
        if self.arrived.is_empty() {
            while let Some(m) = self.recv(Some(Instant::now()))? {
                let flow = matches!(m.0, Message::FlowAccepted { .. });
                self.news(m);
                if flow {
                    break;
                }
            }
        }
        let Some((info, fds, rings)) = self.arrived.pop_front() else {
            return Ok(None);
        };
        if fds.len() < 1 + usize::from(info.direct) {
            // The kernel dropped its descriptor on the way in: the daemon
            // sees the flow closed.
            return Ok(Some(Err(Error::new(
                ErrorKind::NoResources,
                format!(
                    "flow {} from {}, accepted by the daemon, could not be received: this process is at its limit of open descriptors (RLIMIT_NOFILE); close some or raise the limit (rina::raise_fd_limit)",
                    info.port, info.remote
                ),
            ))));
        }
        Ok(Some(flow_from("accept", (Reply::Flow(info), fds), rings)))
    }

    /// The first request queued, once everything the daemon has already
    /// sent is read (so that a withdrawal that came with its request is
    /// seen before the request is handed out).
    fn next_pending(&mut self) -> Result<Option<IncomingFlow>> {
        while let Some(m) = self.recv(Some(Instant::now()))? {
            self.news(m);
        }
        Ok(self.pending.pop_front())
    }

    /// Takes a message that is not the answer to a call: requests are
    /// queued, withdrawn ones dropped from the queue; a reply nobody
    /// waits for (its caller gave up) is dropped, with any descriptor it
    /// carried.
    fn news(&mut self, (msg, fds): (Message, Vec<OwnedFd>)) {
        match msg {
            Message::FlowRequest(r) => self.pending.push_back(r),
            // No descriptor to hold: the flow's SDUs wait in its bundle.
            Message::FlowAccepted { flow, .. } if flow.bundle.is_some() => {
                self.arrived_bundled.push_back(flow)
            }
            Message::FlowAccepted { flow, rings } if self.arrived.len() < MAX_ARRIVED => {
                self.arrived.push_back((flow, fds, rings))
            }
            // Dropping its descriptors closes the flow: its requester sees
            // it end.
            Message::FlowAccepted { .. } => {}
            Message::RequestWithdrawn { handle } => self.withdrawn(handle),
            Message::Unregistered { name, dif } => {
                self.registered.remove(&(name.clone(), dif.clone()));
                if self.registered.is_empty() {
                    self.orphaned = Some(format!(
                        "another connection (an administrator) unregistered {name} from {dif}, \
                         the last name registered on this connection: no flow request will come"
                    ));
                }
            }
            Message::Reply { .. } | Message::Progress { .. } => {}
        }
    }

    /// Fails if every name this connection registered was withdrawn by
    /// another connection.
    fn check_orphaned(&self) -> Result<()> {
        match &self.orphaned {
            Some(why) => Err(Error::new(ErrorKind::NotRegistered, why.clone())),
            None => Ok(()),
        }
    }

    /// Request `handle` is gone: if it was not handed out yet, it never
    /// will be. (One handed out fails its accept with
    /// [`ErrorKind::RequestGone`].)
    fn withdrawn(&mut self, handle: u64) {
        self.pending.retain(|r| r.handle != handle);
    }

    /// The flow requests received but not yet handed out.
    pub fn pending_requests(&self) -> usize {
        self.pending.len()
    }

    /// Accepts a flow request; returns the flow.
    pub fn accept(&mut self, req: &IncomingFlow) -> Result<Flow> {
        let op = Op::Accept {
            handle: req.handle,
            rings: self.rings,
            direct: self.direct,
            bundle: None,
        };
        let r = self.call("accept", op)?;
        flow_from("accept", r, self.rings)
    }

    /// Refuses a flow request; `reason` is passed to the requester.
    pub fn refuse(&mut self, req: &IncomingFlow, reason: &str) -> Result<()> {
        self.call(
            "refuse",
            Op::Refuse {
                handle: req.handle,
                reason: reason.to_owned(),
            },
        )
        .map(|_| ())
    }

    /// Opens a flow bundle: one socket to the daemon that carries any
    /// number of this application's flows ([`crate::bundle`]). Flows go
    /// into it with [`Client::allocate_bundled`],
    /// [`Client::accept_bundled`] and
    /// [`Client::register_accepting_bundled`], from this connection only.
    pub fn open_bundle(&mut self) -> Result<Bundle> {
        match self.call("open_bundle", Op::OpenBundle)? {
            (Reply::Bundle { id }, fds) => match fds.into_iter().next() {
                Some(fd) => Ok(Bundle::new(fd, id)),
                None => Err(Error::new(
                    ErrorKind::NoResources,
                    format!(
                        "bundle {id} could not be received: this process is at its limit of \
                         open descriptors (RLIMIT_NOFILE)"
                    ),
                )),
            },
            (other, _) => Err(unexpected("open_bundle", &other)),
        }
    }

    /// Allocates a flow as [`Client::allocate`] does, carried in `bundle`
    /// instead of a descriptor of its own; its SDUs go with
    /// [`Bundle::write`] to the returned [`FlowInfo::port`].
    pub fn allocate_bundled(
        &mut self,
        bundle: &Bundle,
        local: &AppName,
        remote: &AppName,
        dif: Option<&str>,
        qos: &QosSpec,
    ) -> Result<FlowInfo> {
        let op = Op::Allocate {
            local: local.clone(),
            remote: remote.clone(),
            dif: dif.map(str::to_owned),
            qos: *qos,
            rings: false,
            direct: false,
            bundle: Some(bundle.id()),
        };
        bundled_from("allocate", self.call("allocate", op)?)
    }

    /// Accepts a flow request as [`Client::accept`] does, into `bundle`.
    pub fn accept_bundled(&mut self, req: &IncomingFlow, bundle: &Bundle) -> Result<FlowInfo> {
        let op = Op::Accept {
            handle: req.handle,
            rings: false,
            direct: false,
            bundle: Some(bundle.id()),
        };
        bundled_from("accept", self.call("accept", op)?)
    }

    /// Registers `name` as [`Client::register_accepting`] does, the daemon
    /// putting every flow it accepts into `bundle`;
    /// [`Client::next_bundled_flow`] says which they are.
    pub fn register_accepting_bundled(
        &mut self,
        name: &AppName,
        dif: Option<&str>,
        bundle: &Bundle,
    ) -> Result<Vec<String>> {
        let accept = AutoAccept {
            rings: false,
            direct: false,
            bundle: Some(bundle.id()),
        };
        self.register_with(name, dif, Some(accept))
    }

    /// The next flow the daemon accepted into a bundle for a registration
    /// of [`Client::register_accepting_bundled`], waiting at most
    /// `timeout`; `None` if none came. Its SDUs may be in the bundle
    /// before it is handed out here.
    pub fn next_bundled_flow(&mut self, timeout: Duration) -> Result<Option<FlowInfo>> {
        let deadline = Instant::now().checked_add(timeout);
        self.wait_news(deadline, |c| Ok(c.arrived_bundled.pop_front()))
    }

    /// The flows the daemon accepted into bundles that are received but
    /// not yet handed out.
    pub fn bundled_flows(&self) -> usize {
        self.arrived_bundled.len()
    }

    /// Lists the daemon's IPC processes. Each lists a few of its names
    /// ([`IpcpInfo::names`]) and counts the others
    /// ([`IpcpInfo::names_more`]); [`Client::list_names`] gives them all.
    pub fn list_ipcps(&mut self) -> Result<Vec<IpcpInfo>> {
        match self.call("list_ipcps", Op::ListIpcps)? {
            (Reply::Ipcps { ipcps }, _) => Ok(ipcps),
            (other, _) => Err(unexpected("list_ipcps", &other)),
        }
    }

    /// Lists the daemon's DIFs.
    pub fn list_difs(&mut self) -> Result<Vec<DifInfo>> {
        match self.call("list_difs", Op::ListDifs)? {
            (Reply::Difs { difs }, _) => Ok(difs),
            (other, _) => Err(unexpected("list_difs", &other)),
        }
    }

    /// Lists the registered application names (the daemon shows a user
    /// who is not one of its administrators only that user's names). Asks
    /// for as many pages as the daemon has.
    pub fn list_names(&mut self) -> Result<Vec<NameInfo>> {
        let mut all = Vec::new();
        let mut skip = None;
        loop {
            match self.call("list_names", Op::ListNames { skip })? {
                (Reply::Names { names, next }, _) => {
                    all.extend(names);
                    match next {
                        Some(n) if Some(n) > skip => skip = Some(n),
                        _ => return Ok(all),
                    }
                }
                (other, _) => return Err(unexpected("list_names", &other)),
            }
        }
    }

    /// Lists the flows and their counters (the daemon shows a user who is
    /// not one of its administrators only that user's flows). Asks for as
    /// many pages as the daemon has.
    pub fn list_flows(&mut self) -> Result<Vec<FlowStats>> {
        let mut all = Vec::new();
        let mut after = None;
        loop {
            match self.call("list_flows", Op::ListFlows { after })? {
                (Reply::Flows { flows, next }, _) => {
                    all.extend(flows);
                    match next {
                        Some(n) if Some(n) > after => after = Some(n),
                        _ => return Ok(all),
                    }
                }
                (other, _) => return Err(unexpected("list_flows", &other)),
            }
        }
    }

    /// What the daemon knows of the flow whose descriptor is `fd` (its
    /// port-id, names, QoS and largest SDU), found by the socket itself:
    /// for a flow descriptor this process did not get from a [`Client`]
    /// (inherited across `exec`, or passed over a Unix socket). A socket
    /// that is no flow, or another user's flow (for a client that is not
    /// an administrator), is [`ErrorKind::UnknownFlow`].
    pub fn flow_info_of(&mut self, fd: impl AsFd) -> Result<ctl::FlowInfo> {
        let st = nix::sys::stat::fstat(fd.as_fd().as_raw_fd()).map_err(|e| {
            Error::new(
                ErrorKind::InvalidRequest,
                format!("not an open descriptor: {e}"),
            )
        })?;
        let op = Op::FlowBySocket {
            dev: st.st_dev as u64,
            ino: st.st_ino as u64,
        };
        match self.call("flow_by_socket", op)? {
            (Reply::Flow(info), _) => Ok(info),
            (other, _) => Err(unexpected("flow_by_socket", &other)),
        }
    }

    /// Deallocates the flow with port-id `port`, which this client need
    /// not hold: a flow of this user's (or any, for an administrator of
    /// the daemon). Refused with [`ErrorKind::PermissionDenied`] otherwise.
    pub fn deallocate_port(&mut self, port: u32) -> Result<()> {
        self.call("deallocate", Op::Deallocate { port }).map(|_| ())
    }

    /// Reads the RIB of IPC process `ipcp` under `path` (all of it with
    /// `None`), `depth` levels deep (all with `None`).
    pub fn read_rib(
        &mut self,
        ipcp: &str,
        path: Option<&str>,
        depth: Option<u32>,
    ) -> Result<Vec<RibObjectInfo>> {
        let op = Op::ReadRib {
            ipcp: ipcp.to_string(),
            path: path.map(str::to_string),
            depth,
            remote: None,
        };
        match self.call("read_rib", op)? {
            (Reply::Rib { objects }, _) => Ok(objects),
            (other, _) => Err(unexpected("read_rib", &other)),
        }
    }

    /// Reads the RIB of `neighbor` (its IPCP name or address), a neighbour
    /// of normal IPC process `ipcp` in its DIF, under `path`, `depth`
    /// levels deep, over the DIF (CDAP `M_READ`).
    pub fn read_remote_rib(
        &mut self,
        ipcp: &str,
        neighbor: &str,
        path: Option<&str>,
        depth: Option<u32>,
    ) -> Result<Vec<RibObjectInfo>> {
        let op = Op::ReadRib {
            ipcp: ipcp.to_string(),
            path: path.map(str::to_string),
            depth,
            remote: Some(neighbor.to_string()),
        };
        match self.call("read_rib", op)? {
            (Reply::Rib { objects }, _) => Ok(objects),
            (other, _) => Err(unexpected("read_rib", &other)),
        }
    }

    /// The RMT scheduling policy of normal IPC process `ipcp` and the
    /// counters (queued, sent, dropped, maximum occupancy) of every queue
    /// of every N-1 port.
    pub fn scheduler(&mut self, ipcp: &str) -> Result<SchedulerInfo> {
        self.scheduler_op(ipcp, None)
    }

    /// Replaces the RMT scheduling policy of normal IPC process `ipcp` and
    /// returns the new policy's (fresh) counters. `policy` is the policy and
    /// its parameters, as in the daemon's `[ipcp.scheduler]` table, e.g.
    /// `{"policy": "qta-mux", "cherish_thresholds": [100, 50]}`. PDUs queued
    /// under the old policy are discarded. A bad policy is refused with
    /// [`ErrorKind::InvalidRequest`] and a message naming the parameter.
    pub fn set_scheduler(
        &mut self,
        ipcp: &str,
        policy: serde_json::Value,
    ) -> Result<SchedulerInfo> {
        self.scheduler_op(ipcp, Some(policy))
    }

    /// Makes normal IPC process `ipcp` a neighbour of IPC process `name`
    /// reached over DIF `over`, at `address` if known: the daemon registers
    /// `ipcp` in `over` and keeps an N-1 flow up. Administrators only.
    pub fn add_neighbor(
        &mut self,
        ipcp: &str,
        name: &AppName,
        over: &str,
        address: Option<u64>,
    ) -> Result<()> {
        let op = Op::AddNeighbor {
            ipcp: ipcp.into(),
            name: name.clone(),
            over: over.into(),
            address,
        };
        self.call("add_neighbor", op).map(|_| ())
    }

    /// Creates an IPC process from the keys of one `[[ipcp]]` table
    /// (TOML). Returns what changed. Administrators only.
    pub fn create_ipcp(&mut self, config: &str) -> Result<Vec<String>> {
        let op = Op::CreateIpcp {
            config: config.into(),
        };
        self.changes("create_ipcp", op)
    }

    /// Destroys IPC process `ipcp` and what rests on it. Returns what was
    /// torn down. Administrators only.
    pub fn destroy_ipcp(&mut self, ipcp: &str) -> Result<Vec<String>> {
        let op = Op::DestroyIpcp { ipcp: ipcp.into() };
        self.changes("destroy_ipcp", op)
    }

    /// Enrolls normal IPC process `ipcp` through neighbour `neighbor`
    /// over DIF `over`; waits for the outcome (at most `timeout`), handing
    /// each step to `on_step` as it happens. Returns the address and the
    /// steps. Administrators only.
    pub fn enroll(
        &mut self,
        ipcp: &str,
        neighbor: &AppName,
        over: &str,
        address: Option<u64>,
        timeout: Option<Duration>,
        on_step: &mut dyn FnMut(&str),
    ) -> Result<(u64, Vec<String>)> {
        let op = Op::Enroll {
            ipcp: ipcp.into(),
            neighbor: neighbor.clone(),
            over: over.into(),
            address,
            timeout_ms: timeout.map(|t| t.as_millis().min(u64::MAX as u128) as u64),
        };
        match self.call_with("enroll", op, on_step)? {
            (Reply::Enrolled { address, steps }, _) => Ok((address, steps)),
            (other, _) => Err(unexpected("enroll", &other)),
        }
    }

    /// Changes the EFCP policies of QoS cube `cube` of normal IPC process
    /// `ipcp` (`set`: the keys of a cube's `efcp` table). Administrators
    /// only.
    pub fn set_efcp(
        &mut self,
        ipcp: &str,
        cube: &str,
        set: serde_json::Value,
    ) -> Result<Vec<String>> {
        let op = Op::SetEfcp {
            ipcp: ipcp.into(),
            cube: cube.into(),
            set,
        };
        self.changes("set_efcp", op)
    }

    /// Makes the daemon read its configuration file (or `path`) again and
    /// apply the difference. Returns what changed. Administrators only.
    pub fn reload(&mut self, path: Option<&str>) -> Result<Vec<String>> {
        let op = Op::Reload {
            path: path.map(String::from),
        };
        self.changes("reload", op)
    }

    fn changes(&mut self, what: &str, op: Op) -> Result<Vec<String>> {
        match self.call(what, op)? {
            (Reply::Changes { changes }, _) => Ok(changes),
            (Reply::Done, _) => Ok(Vec::new()),
            (other, _) => Err(unexpected(what, &other)),
        }
    }

    /// Forgets neighbour `name` of normal IPC process `ipcp` and
    /// deallocates its N-1 flows. Administrators only.
    pub fn remove_neighbor(&mut self, ipcp: &str, name: &AppName) -> Result<()> {
        let op = Op::RemoveNeighbor {
            ipcp: ipcp.into(),
            name: name.clone(),
        };
        self.call("remove_neighbor", op).map(|_| ())
    }

    /// Registers normal IPC process `ipcp` in lower DIF `dif`, or with
    /// `register = false` withdraws that registration. Administrators only.
    pub fn register_ipcp(&mut self, ipcp: &str, dif: &str, register: bool) -> Result<()> {
        let (ipcp, dif) = (ipcp.to_string(), dif.to_string());
        let op = if register {
            Op::RegisterIpcp { ipcp, dif }
        } else {
            Op::UnregisterIpcp { ipcp, dif }
        };
        self.call("register_ipcp", op).map(|_| ())
    }

    /// Starts capturing what IPC process `ipcp` sends and receives: a
    /// normal IPCP's frames on its N-1 flows, a shim's on its medium
    /// (administrators only). Returns the pcap link type,
    /// the snapshot length and a `SOCK_SEQPACKET` descriptor on which each
    /// frame arrives as one pcap record (`rina_wire::pcap`); closing it
    /// ends the capture. `snaplen`: at most this many bytes of each frame.
    pub fn capture(&mut self, ipcp: &str, snaplen: Option<u32>) -> Result<(u32, u32, OwnedFd)> {
        let op = Op::Capture {
            ipcp: ipcp.to_string(),
            snaplen,
        };
        match self.call("capture", op)? {
            (Reply::Capture { linktype, snaplen }, fds) if !fds.is_empty() => {
                let fd = fds.into_iter().next().expect("not empty");
                Ok((linktype, snaplen, fd))
            }
            (other, _) => Err(unexpected("capture", &other)),
        }
    }

    fn scheduler_op(
        &mut self,
        ipcp: &str,
        set: Option<serde_json::Value>,
    ) -> Result<SchedulerInfo> {
        let op = Op::Scheduler {
            ipcp: ipcp.to_string(),
            set,
        };
        match self.call("scheduler", op)? {
            (Reply::Scheduler(info), _) => Ok(info),
            (other, _) => Err(unexpected("scheduler", &other)),
        }
    }

    /// Sends `op` and waits for its reply, queueing flow requests meanwhile,
    /// for at most the client's timeout. Returns the reply and the descriptors
    /// attached to it, if any.
    fn call(&mut self, what: &str, op: Op) -> Result<(Reply, Vec<OwnedFd>)> {
        self.call_with(what, op, &mut |_| {})
    }

    /// [`Client::call`], handing the lines of [`Message::Progress`] for the
    /// request to `progress` as they arrive.
    fn call_with(
        &mut self,
        what: &str,
        op: Op,
        progress: &mut dyn FnMut(&str),
    ) -> Result<(Reply, Vec<OwnedFd>)> {
        let deadline = self.timeout.and_then(|t| Instant::now().checked_add(t));
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
        // A connection the daemon refused (or closed for being idle) holds
        // its reason; a send would discard it (the kernel purges the queue
        // of a socket whose peer is gone).
        if let Some(e) = self.parting_words() {
            return Err(e);
        }
        let sent = sock::send_until(self.sock.as_fd(), &pkt, deadline)
            .map_err(|e| self.lost("send a request", e))?;
        if !sent {
            return Err(self.timed_out(what, "read"));
        }
        loop {
            let got = match self.recv(deadline) {
                // A reset leaves what the daemon sent last readable.
                Err(e) if e.kind == ErrorKind::DaemonGone => {
                    return Err(self.parting_words().unwrap_or(e))
                }
                r => r?,
            };
            match got {
                None => return Err(self.timed_out(what, "answer")),
                Some((
                    m @ (Message::FlowRequest(_)
                    | Message::FlowAccepted { .. }
                    | Message::RequestWithdrawn { .. }
                    | Message::Unregistered { .. }),
                    fds,
                )) => self.news((m, fds)),
                Some((Message::Progress { id: rid, line }, _)) => {
                    if rid == id {
                        progress(&line);
                    }
                }
                Some((Message::Reply { id: rid, result }, fd)) if rid == id => {
                    return Ok((result?, fd))
                }
                // About the connection itself (refused, malformed traffic):
                // the daemon closes it next, so this is the answer.
                Some((
                    Message::Reply {
                        id: 0,
                        result: Err(e),
                    },
                    _,
                )) => return Err(e.into()),
                Some((Message::Reply { .. }, _)) => {}
            }
        }
    }

    /// Receives one message, waiting until `deadline` (forever without one).
    fn recv(&mut self, deadline: Option<Instant>) -> Result<Option<(Message, Vec<OwnedFd>)>> {
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
        // The protocol attaches at most two descriptors (a direct flow's
        // socket and lifeline); extra ones are closed.
        let mut fds = p.fds;
        fds.truncate(2);
        let msg = match msg {
            // The flow's descriptor (or a direct flow's lifeline) was
            // dropped by the kernel on the way in: the daemon sees the flow
            // closed; say why here. What did come in is closed with `fds`.
            Message::Reply {
                id,
                result: Ok(Reply::Flow(info)),
            } if fds.len() < 1 + usize::from(info.direct) && p.fds_lost => Message::Reply {
                id,
                result: Err(ctl::CtlError::new(
                    ErrorKind::NoResources,
                    format!(
                        "the descriptor of flow {} could not be received: this process is at its limit of open descriptors (RLIMIT_NOFILE); close some or raise the limit (rina::raise_fd_limit)",
                        info.port
                    ),
                )),
            },
            m => m,
        };
        Ok(Some((msg, fds)))
    }

    /// The error the daemon sent about this connection before closing it
    /// (a refused connection), if it is waiting to be read; flow requests
    /// read meanwhile are queued, late replies dropped.
    fn parting_words(&mut self) -> Option<Error> {
        loop {
            match self.recv(Some(Instant::now())) {
                Ok(Some((
                    m @ (Message::FlowRequest(_)
                    | Message::FlowAccepted { .. }
                    | Message::RequestWithdrawn { .. }
                    | Message::Unregistered { .. }),
                    fds,
                ))) => self.news((m, fds)),
                Ok(Some((
                    Message::Reply {
                        id: 0,
                        result: Err(e),
                    },
                    _,
                ))) => return Some(e.into()),
                Ok(Some(_)) => {}
                _ => return None,
            }
        }
    }

    fn timed_out(&self, what: &str, step: &str) -> Error {
        let t = self.timeout.unwrap_or_default();
        Error::new(
            ErrorKind::Timeout,
            format!(
                "the daemon{} did not {step} the {what} request within {} (it is alive but not responding; Client::set_timeout changes this limit)",
                self.at(),
                fmt_duration(t)
            ),
        )
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

fn connect_timeout(path: &Path, timeout: Option<Duration>) -> Error {
    Error::new(
        ErrorKind::Timeout,
        format!(
            "the daemon at {} did not take the connection within {} (its backlog is full: it is alive but not responding)",
            path.display(),
            fmt_duration(timeout.unwrap_or_default())
        ),
    )
}

fn fmt_duration(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{} s", d.as_secs())
    } else {
        format!("{} ms", d.as_millis())
    }
}

/// How long the setup message of a flow's rings may take after the reply
/// (the daemon sends it before the reply, so it is there at once).
const RINGS_SETUP_TIMEOUT: Duration = Duration::from_secs(5);

fn flow_from(what: &str, (reply, fds): (Reply, Vec<OwnedFd>), rings: bool) -> Result<Flow> {
    let mut fds = fds.into_iter();
    match reply {
        Reply::Flow(info) if info.direct => match (fds.next(), fds.next()) {
            (Some(fd), Some(lifeline)) => Ok(Flow::with_lifeline(fd, info, lifeline)),
            _ => Err(Error::new(
                ErrorKind::Internal,
                format!(
                    "the daemon announced direct flow {} without its two descriptors",
                    info.port
                ),
            )),
        },
        Reply::Flow(info) => match fds.next() {
            Some(fd) if rings => {
                match crate::rings::Rings::setup(fd.as_fd(), RINGS_SETUP_TIMEOUT) {
                    Ok(r) => Ok(Flow::with_rings(fd, info, r)),
                    Err(e) => Err(crate::flow::rings_error(&info, e)),
                }
            }
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

/// The flow of a reply to a bundled allocation or accept.
fn bundled_from(what: &str, (reply, _): (Reply, Vec<OwnedFd>)) -> Result<FlowInfo> {
    match reply {
        Reply::Flow(info) if info.bundle.is_some() => Ok(info),
        Reply::Flow(info) => Err(Error::new(
            ErrorKind::Internal,
            format!(
                "the daemon answered a bundled {what} with flow {} outside the bundle",
                info.port
            ),
        )),
        other => Err(unexpected(what, &other)),
    }
}

fn unexpected(what: &str, reply: &Reply) -> Error {
    let kind = match reply {
        Reply::Done => "done",
        Reply::Registered { .. } => "registered",
        Reply::Flow(_) => "flow",
        Reply::Bundle { .. } => "bundle",
        Reply::Ipcps { .. } => "ipcps",
        Reply::Difs { .. } => "difs",
        Reply::Names { .. } => "names",
        Reply::Flows { .. } => "flows",
        Reply::Rib { .. } => "rib",
        Reply::Scheduler(_) => "scheduler",
        Reply::Capture { .. } => "capture",
        Reply::Changes { .. } => "changes",
        Reply::Enrolled { .. } => "enrolled",
    };
    Error::new(
        ErrorKind::Internal,
        format!("the daemon answered {what} with an unexpected '{kind}' reply"),
    )
}
