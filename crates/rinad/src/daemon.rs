//! The event loop of `rinad`: one thread, one `mio::Poll`, every IPCP.
//!
//! This module does IO and bookkeeping only. Protocol decisions are made by
//! the sans-IO machines of `rina-core`; the loop feeds them what arrives on
//! sockets (with the time), and carries out the actions they return.
//!
//! Sources, each with a [`Token`] whose high bits say what it is:
//! * the control listener and control connections (`SOCK_SEQPACKET`, JSON
//!   messages of `rina_wire::ctl`);
//! * one UDP socket per shim-udp IPCP;
//! * the daemon's end of every flow (`SOCK_SEQPACKET`; one read = one SDU);
//! * a self-pipe written by the SIGINT/SIGTERM handler.
//!
//! Fairness: every readable source is served at most [`BUDGET`] packets at a
//! time and then requeued, so one busy flow cannot starve the others.
//! Back-pressure: when a UDP socket's send buffer is full, the IPCP stops
//! reading its flows until the socket is writable again; the applications'
//! writes then block in their own socket buffers. Nothing waits unbounded: a
//! control client that does not read its replies is disconnected once
//! [`CONN_QUEUE_MAX`] messages are queued for it.

use crate::config::{Config, IpcpKind};
use crate::sys::{self, Recv, Sent};
use mio::net::UdpSocket;
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};
use rina_core::shim_udp::{self, Action, PortId, Received, ShimError, ShimUdp};
use rina_core::Instant;
use rina_wire::ctl::{
    self, CtlError, DifInfo, ErrorKind, FlowInfo, FlowStats, IncomingFlow, IpcpInfo, Message,
    NameInfo, Op, Reply, Request,
};
use rina_wire::shim_udp::DATA_HEADER_LEN;
use rina_wire::AppName;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io::{self, Read};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;
use tracing::{debug, info, warn};

/// Packets served from one source before the others get a turn.
pub const BUDGET: usize = 64;
/// Messages queued for a control client before it is disconnected.
pub const CONN_QUEUE_MAX: usize = 1024;
/// Bytes queued for a control client before it is disconnected.
pub const CONN_QUEUE_BYTES: usize = 16 << 20;
/// Control connections served at once; more are closed on arrival.
pub const MAX_CONNS: usize = 1024;
/// Names one control connection may hold registered.
pub const MAX_NAMES_PER_CONN: usize = 256;
/// Wait before accepting again after the daemon ran out of descriptors.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);
/// Bytes kept free in front of every SDU so lower layers can prepend headers.
const HEADROOM: usize = 64;
/// Send buffer asked for on each flow socket.
const FLOW_SNDBUF: usize = 1 << 20;
/// Receive buffer asked for on each UDP socket.
const UDP_RCVBUF: usize = 4 << 20;

const LISTENER: Token = Token(0);
const SIGNAL: Token = Token(1);
const SHIFT: u32 = 40;
const T_UDP: usize = 1;
const T_CONN: usize = 2;
const T_FLOW: usize = 3;

fn token(kind: usize, id: usize) -> Token {
    Token((kind << SHIFT) | id)
}

fn untoken(t: Token) -> (usize, usize) {
    (t.0 >> SHIFT, t.0 & ((1 << SHIFT) - 1))
}

/// One IPC process and its IO.
struct Ipcp {
    name: String,
    kind: IpcpKind,
    dif: String,
    bind: SocketAddr,
    shim: ShimUdp,
    sock: UdpSocket,
    /// Datagrams the kernel refused for reasons other than a full buffer.
    send_errors: u64,
    /// A datagram waiting for the socket to become writable.
    stalled: Option<(SocketAddr, Vec<u8>)>,
    /// Flows whose reading waits for the stall to end.
    parked: Vec<PortId>,
    /// Already in the ready queue.
    rx_queued: bool,
}

/// The daemon's end of an allocated flow.
struct FlowSlot {
    ipcp: usize,
    fd: OwnedFd,
    /// The control connection that allocated or accepted it.
    owner: usize,
    /// Already in the ready queue.
    queued: bool,
}

/// A control connection.
struct Conn {
    fd: OwnedFd,
    out: VecDeque<(Vec<u8>, Option<OwnedFd>)>,
    out_bytes: usize,
    names: Vec<(usize, AppName)>,
}

/// An allocation waiting for the peer's answer.
struct PendingAlloc {
    conn: usize,
    id: u64,
}

/// An incoming flow request waiting for an application's answer.
struct Incoming {
    ipcp: usize,
    shim_handle: u64,
    conn: usize,
}

/// Why `run` stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// Another daemon answers on the socket path.
    #[error("another rinad is already listening on {0}")]
    AlreadyRunning(PathBuf),
    /// A socket could not be set up.
    #[error("{what}: {source}")]
    Io { what: String, source: io::Error },
}

fn io_ctx(what: impl Into<String>) -> impl FnOnce(io::Error) -> DaemonError {
    let what = what.into();
    move |source| DaemonError::Io { what, source }
}

/// The IPC Manager of one system with all its IPC processes.
pub struct Daemon {
    system: String,
    poll: Poll,
    start: std::time::Instant,
    listener: OwnedFd,
    socket_path: PathBuf,
    signal_rx: UnixStream,
    ipcps: Vec<Ipcp>,
    flows: HashMap<PortId, FlowSlot>,
    conns: HashMap<usize, Conn>,
    next_conn: usize,
    owners: HashMap<(usize, AppName), usize>,
    allocs: HashMap<PortId, PendingAlloc>,
    incoming: HashMap<u64, Incoming>,
    next_handle: u64,
    next_port: PortId,
    ready_flows: VecDeque<PortId>,
    ready_udp: VecDeque<usize>,
    closing: Vec<usize>,
    accept_retry: Option<Instant>,
    buf: Vec<u8>,
    ctl_buf: Vec<u8>,
}

impl Daemon {
    /// Binds every socket of the configuration. Fails if another daemon
    /// already serves `socket_path`.
    pub fn new(cfg: &Config, socket_path: PathBuf) -> Result<Daemon, DaemonError> {
        let poll = Poll::new().map_err(io_ctx("cannot create the poller"))?;
        if socket_path.exists() {
            if sys::seqpacket_alive(&socket_path) {
                return Err(DaemonError::AlreadyRunning(socket_path));
            }
            let _ = std::fs::remove_file(&socket_path);
        }
        let listener = sys::seqpacket_listener(&socket_path).map_err(io_ctx(format!(
            "cannot listen on {}",
            socket_path.display()
        )))?;
        poll.registry()
            .register(
                &mut SourceFd(&listener.as_raw_fd()),
                LISTENER,
                Interest::READABLE,
            )
            .map_err(io_ctx("poll register"))?;

        let (signal_rx, signal_tx) = UnixStream::pair().map_err(io_ctx("signal pipe"))?;
        signal_rx
            .set_nonblocking(true)
            .map_err(io_ctx("signal pipe"))?;
        for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
            let tx = signal_tx.try_clone().map_err(io_ctx("signal pipe"))?;
            signal_hook::low_level::pipe::register(sig, tx)
                .map_err(io_ctx("cannot install signal handler"))?;
        }
        poll.registry()
            .register(
                &mut SourceFd(&signal_rx.as_raw_fd()),
                SIGNAL,
                Interest::READABLE,
            )
            .map_err(io_ctx("poll register"))?;

        let mut ipcps = Vec::new();
        for (i, ic) in cfg.ipcps.iter().enumerate() {
            match ic.kind {
                IpcpKind::ShimUdp => {
                    let bind = ic.bind.unwrap_or_else(|| ([127, 0, 0, 1], 0).into());
                    let mut sock = UdpSocket::bind(bind).map_err(io_ctx(format!(
                        "IPCP {}: cannot bind UDP {bind}",
                        ic.name.get_ref()
                    )))?;
                    let _ = nix::sys::socket::setsockopt(
                        &sock,
                        nix::sys::socket::sockopt::RcvBuf,
                        &UDP_RCVBUF,
                    );
                    poll.registry()
                        .register(&mut sock, token(T_UDP, i), Interest::READABLE)
                        .map_err(io_ctx("poll register"))?;
                    let bound = sock.local_addr().unwrap_or(bind);
                    let mut sc = shim_udp::Config::new(ic.dif.clone());
                    if let Some(m) = &ic.max_sdu {
                        sc.max_sdu = *m.get_ref();
                    }
                    sc.directory = ic.directory.clone().into_iter().collect();
                    info!(ipcp = %ic.name.get_ref(), dif = %ic.dif, %bound, max_sdu = sc.max_sdu,
                        directory = sc.directory.len(), "shim-udp IPCP up");
                    ipcps.push(Ipcp {
                        name: ic.name.get_ref().clone(),
                        kind: ic.kind,
                        dif: ic.dif.clone(),
                        bind: bound,
                        shim: ShimUdp::new(sc),
                        sock,
                        send_errors: 0,
                        stalled: None,
                        parked: Vec::new(),
                        rx_queued: false,
                    });
                }
            }
        }
        let fds = sys::raise_fd_limit();
        info!(system = %cfg.system.name, socket = %socket_path.display(), ipcps = ipcps.len(), fd_limit = fds, "rinad ready");
        Ok(Daemon {
            system: cfg.system.name.clone(),
            poll,
            start: std::time::Instant::now(),
            listener,
            socket_path,
            signal_rx,
            ipcps,
            flows: HashMap::new(),
            conns: HashMap::new(),
            next_conn: 1,
            owners: HashMap::new(),
            allocs: HashMap::new(),
            incoming: HashMap::new(),
            next_handle: 1,
            next_port: 1,
            ready_flows: VecDeque::new(),
            ready_udp: VecDeque::new(),
            closing: Vec::new(),
            accept_retry: None,
            buf: vec![0; HEADROOM + 65_536 + 1],
            ctl_buf: vec![0; ctl::MAX_CTL_MSG],
        })
    }

    fn now(&self) -> Instant {
        Instant::from_nanos(self.start.elapsed().as_nanos() as u64)
    }

    /// Runs until SIGINT or SIGTERM.
    pub fn run(mut self) -> Result<(), DaemonError> {
        let mut events = Events::with_capacity(256);
        loop {
            let timeout = if !self.ready_flows.is_empty() || !self.ready_udp.is_empty() {
                Some(Duration::ZERO)
            } else {
                let now = self.now();
                self.ipcps
                    .iter()
                    .filter_map(|ip| ip.shim.poll_timeout())
                    .chain(self.accept_retry)
                    .min()
                    .map(|t| t.saturating_since(now))
            };
            if let Err(e) = self.poll.poll(&mut events, timeout) {
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(DaemonError::Io {
                    what: "poll".into(),
                    source: e,
                });
            }
            let mut stop = false;
            for ev in events.iter() {
                match ev.token() {
                    LISTENER => self.accept_conns(),
                    SIGNAL => stop = true,
                    t => match untoken(t) {
                        (T_UDP, i) => {
                            if ev.is_writable() {
                                self.unstall(i);
                            }
                            if ev.is_readable() {
                                self.mark_udp_ready(i);
                            }
                        }
                        (T_CONN, id) => {
                            if ev.is_writable() {
                                self.flush_conn(id);
                            }
                            if ev.is_readable() || ev.is_read_closed() {
                                self.read_conn(id);
                            }
                        }
                        (T_FLOW, port) => self.mark_flow_ready(port as PortId),
                        _ => {}
                    },
                }
            }
            if stop {
                break;
            }
            self.service_ready();
            let now = self.now();
            if self.accept_retry.is_some_and(|t| t <= now) {
                self.accept_retry = None;
                self.accept_conns();
            }
            for ip in &mut self.ipcps {
                if ip.shim.poll_timeout().is_some_and(|t| t <= now) {
                    ip.shim.handle_timeout(now);
                }
            }
            self.drain_actions();
            for id in std::mem::take(&mut self.closing) {
                self.close_conn(id);
            }
        }
        self.shutdown();
        Ok(())
    }

    fn shutdown(&mut self) {
        let mut b = [0u8; 16];
        let _ = self.signal_rx.read(&mut b);
        info!(flows = self.flows.len(), "shutting down");
        let ports: Vec<PortId> = self.flows.keys().copied().collect();
        for port in ports {
            self.close_flow(port, true);
        }
        self.drain_actions();
        let _ = std::fs::remove_file(&self.socket_path);
    }

    // ---- data path -------------------------------------------------------

    fn mark_flow_ready(&mut self, port: PortId) {
        if let Some(slot) = self.flows.get_mut(&port) {
            if !slot.queued {
                slot.queued = true;
                self.ready_flows.push_back(port);
            }
        }
    }

    fn mark_udp_ready(&mut self, i: usize) {
        if !self.ipcps[i].rx_queued {
            self.ipcps[i].rx_queued = true;
            self.ready_udp.push_back(i);
        }
    }

    fn service_ready(&mut self) {
        for _ in 0..self.ready_udp.len() {
            let Some(i) = self.ready_udp.pop_front() else {
                break;
            };
            self.ipcps[i].rx_queued = false;
            if self.service_udp(i) {
                self.mark_udp_ready(i);
            }
        }
        for _ in 0..self.ready_flows.len() {
            let Some(port) = self.ready_flows.pop_front() else {
                break;
            };
            if let Some(slot) = self.flows.get_mut(&port) {
                slot.queued = false;
            }
            match self.service_flow(port) {
                FlowService::Drained => {}
                FlowService::More => self.mark_flow_ready(port),
                FlowService::Closed => self.close_flow(port, true),
            }
        }
    }

    /// Receives up to [`BUDGET`] datagrams of IPCP `i`; true if there may be more.
    fn service_udp(&mut self, i: usize) -> bool {
        let now = self.now();
        let ip = &mut self.ipcps[i];
        for _ in 0..BUDGET {
            let (n, from) = match ip.sock.recv_from(&mut self.buf) {
                Ok(r) => r,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return false,
                Err(e) => {
                    debug!(ipcp = %ip.name, error = %e, "UDP receive error");
                    return true;
                }
            };
            match ip.shim.on_datagram(now, from, &self.buf[..n]) {
                Received::Deliver { port, sdu } => {
                    let delivered = match self.flows.get(&port) {
                        Some(slot) => {
                            matches!(sys::send(slot.fd.as_raw_fd(), sdu, None), Ok(Sent::Done))
                        }
                        None => false,
                    };
                    if !delivered {
                        if let Some(c) = ip.shim.flow_counters_mut(port) {
                            c.drops_in += 1;
                        }
                    }
                }
                Received::Control => {}
                Received::Dropped(reason) => {
                    debug!(ipcp = %ip.name, %from, ?reason, "datagram dropped");
                }
            }
        }
        true
    }

    /// Reads up to [`BUDGET`] SDUs written by the application on `port` and
    /// sends them.
    fn service_flow(&mut self, port: PortId) -> FlowService {
        let Some(slot) = self.flows.get(&port) else {
            return FlowService::Drained;
        };
        let ip = &mut self.ipcps[slot.ipcp];
        if ip.stalled.is_some() {
            ip.parked.push(port);
            return FlowService::Drained;
        }
        let fd = slot.fd.as_raw_fd();
        let cap = self.buf.len() - HEADROOM;
        for _ in 0..BUDGET {
            let n = match sys::recv(fd, &mut self.buf[HEADROOM..]) {
                Ok(Recv::Packet(n)) => n,
                // Refused (and counted) by the machine below, like any bad SDU.
                Ok(Recv::Empty) => 0,
                Ok(Recv::WouldBlock) => return FlowService::Drained,
                Ok(Recv::Closed) => return FlowService::Closed,
                Err(e) => {
                    debug!(port, error = %e, "flow read error");
                    return FlowService::Closed;
                }
            };
            if n > cap {
                if let Some(c) = ip.shim.flow_counters_mut(port) {
                    c.drops_out += 1;
                }
                continue;
            }
            let (to, hdr) = match ip.shim.send_header(port, n) {
                Ok(h) => h,
                Err(e) => {
                    debug!(port, error = %e, "SDU not sent");
                    continue;
                }
            };
            let start = HEADROOM - DATA_HEADER_LEN;
            self.buf[start..HEADROOM].copy_from_slice(&hdr);
            let dgram = &self.buf[start..HEADROOM + n];
            match ip.sock.send_to(dgram, to) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    ip.stalled = Some((to, dgram.to_vec()));
                    ip.parked.push(port);
                    let _ = self.poll.registry().reregister(
                        &mut ip.sock,
                        token(T_UDP, slot.ipcp),
                        Interest::READABLE | Interest::WRITABLE,
                    );
                    return FlowService::Drained;
                }
                Err(e) => {
                    ip.send_errors += 1;
                    debug!(ipcp = %ip.name, %to, error = %e, "UDP send failed");
                }
            }
        }
        FlowService::More
    }

    fn unstall(&mut self, i: usize) {
        let ip = &mut self.ipcps[i];
        if let Some((to, dgram)) = ip.stalled.take() {
            match ip.sock.send_to(&dgram, to) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    ip.stalled = Some((to, dgram));
                    return;
                }
                Err(_) => ip.send_errors += 1,
                Ok(_) => {}
            }
        }
        let _ = self
            .poll
            .registry()
            .reregister(&mut ip.sock, token(T_UDP, i), Interest::READABLE);
        for port in std::mem::take(&mut ip.parked) {
            self.mark_flow_ready(port);
        }
    }

    // ---- actions of the machines -----------------------------------------

    fn drain_actions(&mut self) {
        for i in 0..self.ipcps.len() {
            while let Some(a) = self.ipcps[i].shim.poll_action() {
                self.on_action(i, a);
            }
        }
    }

    fn on_action(&mut self, i: usize, action: Action) {
        match action {
            Action::Transmit { to, payload } => {
                let ip = &mut self.ipcps[i];
                if let Err(e) = ip.sock.send_to(&payload, to) {
                    ip.send_errors += 1;
                    debug!(ipcp = %ip.name, %to, error = %e, "control datagram not sent");
                }
            }
            Action::FlowRequest {
                handle: shim_handle,
                local,
                remote,
                qos,
            } => {
                let Some(&conn) = self.owners.get(&(i, local.clone())) else {
                    let _ = self.ipcps[i]
                        .shim
                        .refuse(shim_handle, "no application holds the name");
                    return;
                };
                let handle = self.next_handle;
                self.next_handle += 1;
                self.incoming.insert(
                    handle,
                    Incoming {
                        ipcp: i,
                        shim_handle,
                        conn,
                    },
                );
                debug!(ipcp = %self.ipcps[i].name, %local, %remote, handle, "incoming flow request");
                let msg = Message::FlowRequest(IncomingFlow {
                    handle,
                    dif: self.ipcps[i].dif.clone(),
                    local,
                    remote,
                    qos,
                });
                self.send_msg(conn, &msg, None);
            }
            Action::RequestWithdrawn { handle } => {
                self.incoming
                    .retain(|_, inc| !(inc.ipcp == i && inc.shim_handle == handle));
            }
            Action::Allocated { port, .. } => {
                let Some(pa) = self.allocs.remove(&port) else {
                    let _ = self.ipcps[i].shim.deallocate(port);
                    return;
                };
                if !self.conns.contains_key(&pa.conn) {
                    let _ = self.ipcps[i].shim.deallocate(port);
                    return;
                }
                match self.open_flow(i, port, pa.conn) {
                    Ok((info, app_end)) => {
                        info!(port, local = %info.local, remote = %info.remote, dif = %info.dif, "flow allocated");
                        self.reply(pa.conn, pa.id, Ok(Reply::Flow(info)), Some(app_end));
                    }
                    Err(e) => {
                        let _ = self.ipcps[i].shim.deallocate(port);
                        self.reply(pa.conn, pa.id, Err(e), None);
                    }
                }
            }
            Action::AllocateFailed { port, error } => {
                if let Some(pa) = self.allocs.remove(&port) {
                    info!(port, %error, "allocation failed");
                    self.reply(pa.conn, pa.id, Err(shim_error(error)), None);
                }
            }
            Action::Deallocated { port } => {
                info!(port, "flow deallocated by the peer");
                self.close_flow(port, false);
            }
        }
    }

    /// Makes the socket pair of an allocated flow and starts reading its
    /// daemon end.
    fn open_flow(
        &mut self,
        i: usize,
        port: PortId,
        owner: usize,
    ) -> Result<(FlowInfo, OwnedFd), CtlError> {
        let info = self
            .flow_info(i, port)
            .ok_or_else(|| CtlError::new(ErrorKind::Internal, "flow vanished"))?;
        let (ours, theirs) = sys::flow_pair(FLOW_SNDBUF).map_err(|e| {
            CtlError::new(
                ErrorKind::NoResources,
                format!("cannot create flow socket: {e}"),
            )
        })?;
        self.poll
            .registry()
            .register(
                &mut SourceFd(&ours.as_raw_fd()),
                token(T_FLOW, port as usize),
                Interest::READABLE,
            )
            .map_err(|e| CtlError::new(ErrorKind::Internal, e.to_string()))?;
        self.flows.insert(
            port,
            FlowSlot {
                ipcp: i,
                fd: ours,
                owner,
                queued: false,
            },
        );
        Ok((info, theirs))
    }

    fn flow_info(&self, i: usize, port: PortId) -> Option<FlowInfo> {
        let f = self.ipcps[i].shim.flow(port)?;
        Some(FlowInfo {
            port,
            dif: self.ipcps[i].dif.clone(),
            local: f.local.clone(),
            remote: f.remote.clone(),
            qos: f.qos,
            max_sdu: f.max_sdu,
        })
    }

    /// Forgets a flow; `tell_peer` deallocates it in the IPCP too.
    fn close_flow(&mut self, port: PortId, tell_peer: bool) {
        let Some(slot) = self.flows.remove(&port) else {
            return;
        };
        let _ = self
            .poll
            .registry()
            .deregister(&mut SourceFd(&slot.fd.as_raw_fd()));
        if tell_peer {
            info!(port, "flow closed by the application");
            let _ = self.ipcps[slot.ipcp].shim.deallocate(port);
        }
    }

    fn free_port(&mut self) -> PortId {
        loop {
            let p = self.next_port;
            self.next_port = self.next_port.checked_add(1).unwrap_or(1);
            if !self.flows.contains_key(&p)
                && !self.allocs.contains_key(&p)
                && self.ipcps.iter().all(|ip| ip.shim.flow(p).is_none())
            {
                return p;
            }
        }
    }

    // ---- control connections ---------------------------------------------

    fn accept_conns(&mut self) {
        loop {
            match sys::accept(&self.listener) {
                Ok(Some(fd)) => {
                    if self.conns.len() >= MAX_CONNS {
                        warn!(
                            max = MAX_CONNS,
                            "too many control connections; closing the new one"
                        );
                        continue;
                    }
                    let id = self.next_conn;
                    self.next_conn += 1;
                    if self
                        .poll
                        .registry()
                        .register(
                            &mut SourceFd(&fd.as_raw_fd()),
                            token(T_CONN, id),
                            Interest::READABLE,
                        )
                        .is_err()
                    {
                        continue;
                    }
                    debug!(conn = id, "client connected");
                    self.conns.insert(
                        id,
                        Conn {
                            fd,
                            out: VecDeque::new(),
                            out_bytes: 0,
                            names: Vec::new(),
                        },
                    );
                }
                Ok(None) => return,
                Err(e) => {
                    // Typically out of descriptors: the pending connections
                    // stay queued; try again shortly (readiness is edge-triggered).
                    warn!(error = %e, "accept failed; retrying shortly");
                    self.accept_retry = Some(self.now() + ACCEPT_RETRY);
                    return;
                }
            }
        }
    }

    fn read_conn(&mut self, id: usize) {
        for _ in 0..BUDGET {
            let Some(conn) = self.conns.get(&id) else {
                return;
            };
            let fd = conn.fd.as_raw_fd();
            let mut buf = std::mem::take(&mut self.ctl_buf);
            let got = sys::recv(fd, &mut buf);
            let decoded = match &got {
                Ok(Recv::Packet(n)) if *n <= buf.len() => Some(ctl::decode::<Request>(&buf[..*n])),
                _ => None,
            };
            let cap = buf.len();
            self.ctl_buf = buf;
            match got {
                Ok(Recv::Packet(n)) if n > cap => {
                    let e = CtlError::new(
                        ErrorKind::InvalidRequest,
                        format!("control message of {n} bytes exceeds {}", ctl::MAX_CTL_MSG),
                    );
                    self.reply(id, 0, Err(e), None);
                }
                Ok(Recv::Packet(_)) => match decoded {
                    Some(Ok(req)) => self.on_request(id, req),
                    Some(Err(e)) => {
                        let e = CtlError::new(
                            ErrorKind::InvalidRequest,
                            format!("malformed request: {e}"),
                        );
                        self.reply(id, 0, Err(e), None);
                    }
                    None => {}
                },
                Ok(Recv::Empty) => {
                    let e = CtlError::new(ErrorKind::InvalidRequest, "empty control message");
                    self.reply(id, 0, Err(e), None);
                }
                Ok(Recv::WouldBlock) => return,
                Ok(Recv::Closed) | Err(_) => {
                    self.closing.push(id);
                    return;
                }
            }
        }
        // More may be waiting; edge-triggered readiness will not say so again.
        self.read_conn_later(id);
    }

    fn read_conn_later(&mut self, id: usize) {
        if let Some(conn) = self.conns.get(&id) {
            let _ = self.poll.registry().reregister(
                &mut SourceFd(&conn.fd.as_raw_fd()),
                token(T_CONN, id),
                Interest::READABLE | Interest::WRITABLE,
            );
        }
    }

    fn close_conn(&mut self, id: usize) {
        let Some(conn) = self.conns.remove(&id) else {
            return;
        };
        let _ = self
            .poll
            .registry()
            .deregister(&mut SourceFd(&conn.fd.as_raw_fd()));
        for (i, name) in conn.names {
            self.ipcps[i].shim.unregister(&name);
            self.owners.remove(&(i, name.clone()));
            info!(%name, ipcp = %self.ipcps[i].name, "unregistered (client gone)");
        }
        let theirs: Vec<u64> = self
            .incoming
            .iter()
            .filter(|(_, inc)| inc.conn == id)
            .map(|(h, _)| *h)
            .collect();
        for h in theirs {
            if let Some(inc) = self.incoming.remove(&h) {
                let _ = self.ipcps[inc.ipcp]
                    .shim
                    .refuse(inc.shim_handle, "the application went away");
            }
        }
        debug!(conn = id, "client disconnected");
    }

    fn reply(
        &mut self,
        conn: usize,
        id: u64,
        result: Result<Reply, CtlError>,
        fd: Option<OwnedFd>,
    ) {
        self.send_msg(conn, &Message::Reply { id, result }, fd);
    }

    fn send_msg(&mut self, id: usize, msg: &Message, fd: Option<OwnedFd>) {
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        let mut bytes = ctl::encode(msg);
        if conn.out.is_empty() {
            let raw = fd.as_ref().map(|f| f.as_raw_fd());
            match sys::send(conn.fd.as_raw_fd(), &bytes, raw) {
                Ok(Sent::Done) => return,
                Ok(Sent::WouldBlock) => {}
                Ok(Sent::TooBig) => {
                    bytes = too_big(msg, bytes.len());
                    if matches!(sys::send(conn.fd.as_raw_fd(), &bytes, None), Ok(Sent::Done)) {
                        return;
                    }
                }
                Ok(Sent::Closed) | Err(_) => {
                    self.closing.push(id);
                    return;
                }
            }
        }
        if conn.out.len() >= CONN_QUEUE_MAX || conn.out_bytes + bytes.len() > CONN_QUEUE_BYTES {
            warn!(conn = id, "client does not read its replies; disconnecting");
            self.closing.push(id);
            return;
        }
        conn.out_bytes += bytes.len();
        conn.out.push_back((bytes, fd));
        let _ = self.poll.registry().reregister(
            &mut SourceFd(&conn.fd.as_raw_fd()),
            token(T_CONN, id),
            Interest::READABLE | Interest::WRITABLE,
        );
    }

    fn flush_conn(&mut self, id: usize) {
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        while let Some((bytes, fd)) = conn.out.front() {
            let raw = fd.as_ref().map(|f| f.as_raw_fd());
            match sys::send(conn.fd.as_raw_fd(), bytes, raw) {
                Ok(Sent::Done) => {
                    conn.out_bytes -= bytes.len();
                    conn.out.pop_front();
                }
                Ok(Sent::TooBig) => {
                    let n = bytes.len();
                    // The queued bytes are our own encoding: decoding gives the id back.
                    let err = match ctl::decode::<Message>(bytes) {
                        Ok(msg) => too_big(&msg, n),
                        Err(_) => Vec::new(),
                    };
                    conn.out_bytes = conn.out_bytes - n + err.len();
                    if let Some(front) = conn.out.front_mut() {
                        *front = (err, None);
                    }
                }
                Ok(Sent::WouldBlock) => return,
                Ok(Sent::Closed) | Err(_) => {
                    self.closing.push(id);
                    return;
                }
            }
        }
        let _ = self.poll.registry().reregister(
            &mut SourceFd(&conn.fd.as_raw_fd()),
            token(T_CONN, id),
            Interest::READABLE,
        );
        // A read may have been deferred by the budget.
        self.read_conn(id);
    }

    fn on_request(&mut self, conn: usize, req: Request) {
        let id = req.id;
        let result = match req.op {
            Op::Register { name, dif } => self.register(conn, name, dif),
            Op::Unregister { name, dif } => self.unregister(conn, &name, dif),
            Op::Allocate {
                local,
                remote,
                dif,
                qos,
            } => match self.allocate(conn, id, local, remote, dif, qos) {
                Ok(()) => return,
                Err(e) => Err(e),
            },
            Op::Accept { handle } => {
                match self.accept_incoming(conn, handle) {
                    Ok((info, fd)) => self.reply(conn, id, Ok(Reply::Flow(info)), Some(fd)),
                    Err(e) => self.reply(conn, id, Err(e), None),
                }
                return;
            }
            Op::Refuse { handle, reason } => self.refuse_incoming(conn, handle, &reason),
            Op::Deallocate { port } => match self.flows.get(&port) {
                Some(slot) if slot.owner == conn => {
                    self.close_flow(port, true);
                    Ok(Reply::Done)
                }
                // Another client's flow looks the same as no flow at all.
                _ => Err(CtlError::new(
                    ErrorKind::UnknownFlow,
                    format!("this client has no flow with port-id {port}"),
                )),
            },
            Op::ListIpcps => Ok(Reply::Ipcps {
                ipcps: self.list_ipcps(),
            }),
            Op::ListDifs => Ok(Reply::Difs {
                difs: self.list_difs(),
            }),
            Op::ListNames => Ok(Reply::Names {
                names: self.list_names(),
            }),
            Op::ListFlows => Ok(Reply::Flows {
                flows: self.list_flows(),
            }),
        };
        self.reply(conn, id, result, None);
    }

    /// IPCPs in `dif`, or every IPCP without one.
    fn ipcps_in(&self, dif: Option<&str>) -> Result<Vec<usize>, CtlError> {
        if self.ipcps.is_empty() {
            return Err(CtlError::new(
                ErrorKind::NoDif,
                format!("system {} has no IPC process", self.system),
            ));
        }
        match dif {
            None => Ok((0..self.ipcps.len()).collect()),
            Some(d) => {
                let v: Vec<usize> = (0..self.ipcps.len())
                    .filter(|&i| self.ipcps[i].dif == d)
                    .collect();
                if v.is_empty() {
                    let known: Vec<&str> = self.ipcps.iter().map(|ip| ip.dif.as_str()).collect();
                    return Err(CtlError::new(
                        ErrorKind::UnknownDif,
                        format!("no DIF named {d:?}; this system has {}", known.join(", ")),
                    ));
                }
                Ok(v)
            }
        }
    }

    fn register(
        &mut self,
        conn: usize,
        name: AppName,
        dif: Option<String>,
    ) -> Result<Reply, CtlError> {
        let targets = self.ipcps_in(dif.as_deref())?;
        let held = self.conns.get(&conn).map_or(0, |c| c.names.len());
        if held + targets.len() > MAX_NAMES_PER_CONN {
            return Err(CtlError::new(
                ErrorKind::NoResources,
                format!("a client may hold at most {MAX_NAMES_PER_CONN} registrations"),
            ));
        }
        if let Some(&i) = targets
            .iter()
            .find(|&&i| self.owners.contains_key(&(i, name.clone())))
        {
            return Err(CtlError::new(
                ErrorKind::NameInUse,
                format!("{name} is already registered in DIF {}", self.ipcps[i].dif),
            ));
        }
        let mut difs = Vec::new();
        for i in targets {
            self.ipcps[i]
                .shim
                .register(name.clone())
                .map_err(shim_error)?;
            self.owners.insert((i, name.clone()), conn);
            if let Some(c) = self.conns.get_mut(&conn) {
                c.names.push((i, name.clone()));
            }
            info!(%name, ipcp = %self.ipcps[i].name, "registered");
            difs.push(self.ipcps[i].dif.clone());
        }
        Ok(Reply::Registered { difs })
    }

    fn unregister(
        &mut self,
        conn: usize,
        name: &AppName,
        dif: Option<String>,
    ) -> Result<Reply, CtlError> {
        let targets = self.ipcps_in(dif.as_deref())?;
        let mut found = false;
        for i in targets {
            if self.owners.get(&(i, name.clone())) == Some(&conn) {
                self.owners.remove(&(i, name.clone()));
                self.ipcps[i].shim.unregister(name);
                if let Some(c) = self.conns.get_mut(&conn) {
                    c.names.retain(|(j, n)| !(*j == i && n == name));
                }
                found = true;
            }
        }
        if found {
            Ok(Reply::Done)
        } else {
            Err(CtlError::new(
                ErrorKind::InvalidRequest,
                format!("{name} is not registered by this client"),
            ))
        }
    }

    fn allocate(
        &mut self,
        conn: usize,
        id: u64,
        local: AppName,
        remote: AppName,
        dif: Option<String>,
        qos: rina_wire::QosSpec,
    ) -> Result<(), CtlError> {
        let candidates = self.ipcps_in(dif.as_deref())?;
        let i = candidates
            .iter()
            .copied()
            .find(|&i| self.ipcps[i].shim.knows(&remote))
            .ok_or_else(|| {
                CtlError::new(
                    ErrorKind::NameNotFound,
                    match &dif {
                        Some(d) => format!("{remote} is not known in DIF {d}"),
                        None => format!("no DIF of system {} knows {remote}", self.system),
                    },
                )
            })?;
        let port = self.free_port();
        let now = self.now();
        self.ipcps[i]
            .shim
            .allocate(now, port, local.clone(), remote.clone(), qos)
            .map_err(shim_error)?;
        info!(port, %local, %remote, ipcp = %self.ipcps[i].name, "allocating");
        self.allocs.insert(port, PendingAlloc { conn, id });
        Ok(())
    }

    fn accept_incoming(
        &mut self,
        conn: usize,
        handle: u64,
    ) -> Result<(FlowInfo, OwnedFd), CtlError> {
        let inc = self.take_incoming(conn, handle)?;
        let port = self.free_port();
        self.ipcps[inc.ipcp]
            .shim
            .accept(inc.shim_handle, port)
            .map_err(shim_error)?;
        match self.open_flow(inc.ipcp, port, conn) {
            Ok((info, fd)) => {
                info!(port, local = %info.local, remote = %info.remote, "flow accepted");
                Ok((info, fd))
            }
            Err(e) => {
                let _ = self.ipcps[inc.ipcp].shim.deallocate(port);
                Err(e)
            }
        }
    }

    fn refuse_incoming(
        &mut self,
        conn: usize,
        handle: u64,
        reason: &str,
    ) -> Result<Reply, CtlError> {
        let inc = self.take_incoming(conn, handle)?;
        self.ipcps[inc.ipcp]
            .shim
            .refuse(inc.shim_handle, reason)
            .map_err(shim_error)?;
        Ok(Reply::Done)
    }

    fn take_incoming(&mut self, conn: usize, handle: u64) -> Result<Incoming, CtlError> {
        match self.incoming.get(&handle) {
            Some(inc) if inc.conn == conn => Ok(self.incoming.remove(&handle).expect("present")),
            _ => Err(CtlError::new(
                ErrorKind::InvalidRequest,
                format!("no pending flow request {handle} for this client (answered, withdrawn or timed out)"),
            )),
        }
    }

    // ---- listings ----------------------------------------------------------

    fn list_ipcps(&self) -> Vec<IpcpInfo> {
        self.ipcps
            .iter()
            .map(|ip| {
                let mut counters = ip.shim.counters().to_map();
                counters.insert("tx_errors".into(), ip.send_errors);
                IpcpInfo {
                    name: ip.name.clone(),
                    kind: ip.kind.as_str().into(),
                    dif: ip.dif.clone(),
                    address: ip.bind.to_string(),
                    flows: ip.shim.flows().count(),
                    names: ip.shim.names().cloned().collect(),
                    counters,
                }
            })
            .collect()
    }

    fn list_difs(&self) -> Vec<DifInfo> {
        let mut difs: BTreeMap<&str, (IpcpKind, Vec<String>)> = BTreeMap::new();
        for ip in &self.ipcps {
            let e = difs.entry(&ip.dif).or_insert((ip.kind, Vec::new()));
            e.1.push(ip.name.clone());
        }
        difs.into_iter()
            .map(|(name, (kind, ipcps))| DifInfo {
                name: name.to_string(),
                kind: kind.as_str().into(),
                ipcps,
            })
            .collect()
    }

    fn list_names(&self) -> Vec<NameInfo> {
        self.ipcps
            .iter()
            .flat_map(|ip| {
                ip.shim.names().map(|n| NameInfo {
                    name: n.clone(),
                    dif: ip.dif.clone(),
                    ipcp: ip.name.clone(),
                })
            })
            .collect()
    }

    fn list_flows(&self) -> Vec<FlowStats> {
        let mut v: Vec<FlowStats> = self
            .flows
            .iter()
            .filter_map(|(&port, slot)| {
                let f = self.ipcps[slot.ipcp].shim.flow(port)?;
                Some(FlowStats {
                    info: self.flow_info(slot.ipcp, port)?,
                    ipcp: self.ipcps[slot.ipcp].name.clone(),
                    counters: f.counters,
                })
            })
            .collect();
        v.sort_by_key(|f| f.info.port);
        v
    }
}

enum FlowService {
    Drained,
    More,
    Closed,
}

/// The error reply that replaces a reply too large for the control socket.
fn too_big(msg: &Message, len: usize) -> Vec<u8> {
    let id = match msg {
        Message::Reply { id, .. } => *id,
        Message::FlowRequest(_) => 0,
    };
    let e = CtlError::new(
        ErrorKind::NoResources,
        format!("the reply of {len} bytes is larger than the control socket can carry (raise net.core.wmem_max)"),
    );
    ctl::encode(&Message::Reply { id, result: Err(e) })
}

/// The control-protocol error for a shim error.
fn shim_error(e: ShimError) -> CtlError {
    let kind = match &e {
        ShimError::NameNotFound(_) => ErrorKind::NameNotFound,
        ShimError::NameInUse(_) => ErrorKind::NameInUse,
        ShimError::NotRegistered { .. } => ErrorKind::NotRegistered,
        ShimError::Refused(_) => ErrorKind::Refused,
        ShimError::QosNotSatisfiable(_) => ErrorKind::QosNotSatisfiable,
        ShimError::SduTooLarge { .. } => ErrorKind::SduTooLarge,
        ShimError::EmptySdu => ErrorKind::InvalidRequest,
        ShimError::Timeout { .. } => ErrorKind::Timeout,
        ShimError::UnknownFlow(_) => ErrorKind::UnknownFlow,
        ShimError::UnknownRequest(_) => ErrorKind::InvalidRequest,
        ShimError::PortInUse(_) => ErrorKind::Internal,
        ShimError::NoResources(_) => ErrorKind::NoResources,
    };
    CtlError::new(kind, e.to_string())
}
