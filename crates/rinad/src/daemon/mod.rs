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
//! * one `AF_PACKET` raw socket per shim-eth IPCP ([`shim_eth`]);
//! * shim-hv IPCPs have no descriptor: their shared-memory rings are polled
//!   on a timer ([`shim_hv`]);
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

mod access;
mod app_rings;
mod control;
mod ipcp;
mod manage;
mod normal;
mod shim;
mod shim_eth;
mod shim_hv;

use crate::config::{Config, IpcpKind};
use crate::sys::{self, Recv, Sent};
use ipcp::{Event, Imp, Ipcp};
use mio::net::UdpSocket;
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};
use normal::{Neighbor, NormalIo};
use rina_core::shim_udp::{self, PortId, Received, ShimUdp};
use rina_core::Instant;
use rina_wire::ctl::{
    self, CtlError, DifInfo, ErrorKind, FlowInfo, FlowStats, IncomingFlow, IpcpInfo, Message,
    NameInfo, Op, Reply, Request, RibObjectInfo,
};
use rina_wire::shim_udp::DATA_HEADER_LEN;
use rina_wire::AppName;
use shim::ShimIo;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io::{self, Read};
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
const T_ETH: usize = 4;

fn token(kind: usize, id: usize) -> Token {
    Token((kind << SHIFT) | id)
}

fn untoken(t: Token) -> (usize, usize) {
    (t.0 >> SHIFT, t.0 & ((1 << SHIFT) - 1))
}

/// The daemon's end of an allocated flow.
struct FlowSlot {
    ipcp: usize,
    fd: OwnedFd,
    /// What the application was told about the flow.
    info: FlowInfo,
    /// The control connection that allocated or accepted it.
    owner: usize,
    /// The user of that connection: who may list and deallocate the flow.
    uid: u32,
    /// Already in the ready queue.
    queued: bool,
    /// Shared-memory rings with the application (shim-hv flows that asked).
    rings: Option<app_rings::AppRings>,
}

/// A control connection.
struct Conn {
    fd: OwnedFd,
    out: VecDeque<(Vec<u8>, Option<OwnedFd>)>,
    out_bytes: usize,
    names: Vec<(usize, AppName)>,
    /// Who connected.
    cred: sys::PeerCred,
    /// Whether that is an administrator ([`access`]).
    admin: bool,
    /// When it last sent a request (or connected).
    last_seen: Instant,
}

/// An allocation waiting for the peer's answer.
struct PendingAlloc {
    conn: usize,
    id: u64,
    local: AppName,
    remote: AppName,
    qos: rina_wire::QosSpec,
    /// The application asked for shared-memory rings.
    rings: bool,
}

/// An incoming flow request waiting for an application's answer.
struct Incoming {
    ipcp: usize,
    /// The request's handle in its IPCP.
    ipcp_handle: u64,
    conn: usize,
    local: AppName,
    remote: AppName,
    qos: rina_wire::QosSpec,
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
    /// Who may do what on the control socket.
    access: access::Access,
    /// When to look for idle control connections next.
    idle_sweep: Instant,
    /// N-1 flows of normal IPCPs: port -> (normal IPCP, shim IPCP).
    n1_owner: HashMap<PortId, (usize, usize)>,
    /// N-1 flows being allocated: port -> (normal IPCP, neighbour index).
    n1_pending: HashMap<PortId, (usize, usize)>,
    /// Names registered in shims on behalf of normal IPCPs: (shim, name) -> normal IPCP.
    ipcp_owned: HashMap<(usize, AppName), usize>,
    /// Per IPCP (same index): the capacity of a shim's link, at which
    /// normal IPCPs above pace their N-1 flows over it.
    link_rates: Vec<Option<rina_core::rmt::PortRate>>,
    /// Frames that arrived on N-1 flows not bound yet (bounded by [`BUDGET`]).
    early_n1: Vec<(PortId, Vec<u8>)>,
    buf: Vec<u8>,
    ctl_buf: Vec<u8>,
}

impl Daemon {
    /// Binds every socket of the configuration. Fails if another daemon
    /// already serves `socket_path`.
    pub fn new(cfg: &Config, socket_path: PathBuf) -> Result<Daemon, DaemonError> {
        let poll = Poll::new().map_err(io_ctx("cannot create the poller"))?;
        let access = access::Access::new(&cfg.system)?;
        control::prepare_socket(&socket_path)?;
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
        sys::set_socket_access(
            &socket_path,
            cfg.system.socket_mode(),
            cfg.system.socket_group.as_deref(),
        )
        .map_err(io_ctx(format!(
            "cannot set the mode or group of {}",
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
                IpcpKind::Normal => ipcps.push(new_normal(ic)?),
                IpcpKind::ShimEth => ipcps.push(shim_eth::new_ipcp(cfg, &poll, i)?),
                IpcpKind::ShimHv => ipcps.push(shim_hv::new_ipcp(cfg, i)?),
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
                    if let Some(m) = ic.max_flows {
                        sc.max_flows = m;
                    }
                    info!(ipcp = %ic.name.get_ref(), dif = %ic.dif, %bound, max_sdu = sc.max_sdu,
                        directory = sc.directory.len(), "shim-udp IPCP up");
                    ipcps.push(Ipcp {
                        name: ic.name.get_ref().clone(),
                        dif: ic.dif.clone(),
                        imp: Imp::Shim(Box::new(ShimIo {
                            machine: ShimUdp::new(sc),
                            sock,
                            bind: bound,
                            send_errors: 0,
                            stalled: None,
                            parked: Vec::new(),
                            rx_queued: false,
                        })),
                    });
                }
            }
        }
        let ipcp_owned = wire_normals(cfg, &mut ipcps)?;
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
            access,
            idle_sweep: Instant::from_nanos(0),
            n1_owner: HashMap::new(),
            n1_pending: HashMap::new(),
            ipcp_owned,
            link_rates: cfg.ipcps.iter().map(|ic| ic.port_rate()).collect(),
            early_n1: Vec::new(),
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
                    .filter_map(|ip| ip.poll_timeout())
                    .chain(self.accept_retry)
                    .chain(Some(self.idle_sweep))
                    .chain(self.neighbor_timeout())
                    .chain(self.hv_timeout())
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
                        (T_ETH, i) => {
                            if ev.is_writable() {
                                self.eth_unstall(i);
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
                        (T_FLOW, port) => {
                            if ev.is_writable() {
                                self.normal_flush_rx(port as PortId);
                            }
                            if ev.is_readable() || ev.is_read_closed() {
                                self.mark_flow_ready(port as PortId);
                            }
                        }
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
            if self.idle_sweep <= now {
                self.idle_sweep = self.sweep_idle(now);
            }
            for ip in &mut self.ipcps {
                if ip.poll_timeout().is_some_and(|t| t <= now) {
                    ip.handle_timeout(now);
                }
            }
            self.hv_ticks(now);
            self.drain_events();
            self.deliver_early_n1();
            self.retry_stashes();
            self.keep_neighbors();
            self.drain_events();
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
        self.drain_events();
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
        let queued = match &mut self.ipcps[i].imp {
            Imp::Shim(sh) => &mut sh.rx_queued,
            Imp::ShimEth(e) => &mut e.rx_queued,
            Imp::ShimHv(h) => &mut h.rx_queued,
            Imp::Normal(_) => return,
        };
        if !*queued {
            *queued = true;
            self.ready_udp.push_back(i);
        }
    }

    fn service_ready(&mut self) {
        for _ in 0..self.ready_udp.len() {
            let Some(i) = self.ready_udp.pop_front() else {
                break;
            };
            if let Imp::Shim(sh) = &mut self.ipcps[i].imp {
                sh.rx_queued = false;
            }
            let more = if let Imp::ShimEth(e) = &mut self.ipcps[i].imp {
                e.rx_queued = false;
                self.service_eth(i)
            } else if let Imp::ShimHv(h) = &mut self.ipcps[i].imp {
                h.rx_queued = false;
                self.service_hv(i)
            } else {
                self.service_udp(i)
            };
            if more {
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
        for _ in 0..BUDGET {
            let Imp::Shim(ip) = &mut self.ipcps[i].imp else {
                return false;
            };
            let (n, from) = match ip.sock.recv_from(&mut self.buf) {
                Ok(r) => r,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return false,
                Err(e) => {
                    debug!(ipcp = %self.ipcps[i].name, error = %e, "UDP receive error");
                    return true;
                }
            };
            match ip.machine.on_datagram(now, from, &self.buf[..n]) {
                Received::Deliver { port, sdu } => {
                    if let Some(slot) = self.flows.get(&port) {
                        let sent = sys::send(slot.fd.as_raw_fd(), sdu, None);
                        if !matches!(sent, Ok(Sent::Done)) {
                            if let Some(c) = ip.machine.flow_counters_mut(port) {
                                c.drops_in += 1;
                            }
                        }
                    } else if let Some(&(j, _)) = self.n1_owner.get(&port) {
                        // An N-1 flow of a normal IPCP: hand the frame over in memory.
                        if let Imp::Normal(nm) = &mut self.ipcps[j].imp {
                            nm.machine.on_frame(now, port, sdu);
                        }
                    } else if self.n1_pending.contains_key(&port) && self.early_n1.len() < BUDGET {
                        // The peer's first frames can overtake the binding of a
                        // new N-1 flow (its acceptance is still an undrained
                        // event): keep them for a moment instead of losing them.
                        self.early_n1.push((port, sdu.to_vec()));
                    }
                }
                Received::Control => {}
                Received::Dropped(reason) => {
                    debug!(ipcp = %self.ipcps[i].name, %from, ?reason, "datagram dropped");
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
        if matches!(self.ipcps[slot.ipcp].imp, Imp::Normal(_)) {
            return self.service_normal_flow(port);
        }
        if matches!(self.ipcps[slot.ipcp].imp, Imp::ShimEth(_)) {
            return self.service_eth_flow(port);
        }
        if matches!(self.ipcps[slot.ipcp].imp, Imp::ShimHv(_)) {
            return self.service_hv_flow(port);
        }
        let ipcp = &mut self.ipcps[slot.ipcp];
        let name = &ipcp.name;
        let Imp::Shim(ip) = &mut ipcp.imp else {
            return FlowService::Drained;
        };
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
                if let Some(c) = ip.machine.flow_counters_mut(port) {
                    c.drops_out += 1;
                }
                continue;
            }
            let (to, hdr) = match ip.machine.send_header(port, n) {
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
                    debug!(ipcp = %name, %to, error = %e, "UDP send failed");
                }
            }
        }
        FlowService::More
    }

    fn unstall(&mut self, i: usize) {
        let Imp::Shim(ip) = &mut self.ipcps[i].imp else {
            return;
        };
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
        self.set_medium_blocked(i, false);
    }

    // ---- events of the IPCPs ---------------------------------------------

    fn drain_events(&mut self) {
        for i in 0..self.ipcps.len() {
            while let Some(ev) = self.ipcps[i].poll_event() {
                self.on_event(i, ev);
            }
        }
    }

    fn on_event(&mut self, i: usize, ev: Event) {
        let now = self.now();
        match ev {
            Event::FlowRequest {
                handle: ipcp_handle,
                local,
                remote,
                qos,
            } => {
                if let Some(&j) = self.ipcp_owned.get(&(i, local.clone())) {
                    self.accept_n1(i, j, ipcp_handle, &remote);
                    return;
                }
                let Some(&conn) = self.owners.get(&(i, local.clone())) else {
                    let _ = self.ipcps[i].refuse(ipcp_handle, "no application holds the name");
                    return;
                };
                let handle = self.next_handle;
                self.next_handle += 1;
                self.incoming.insert(
                    handle,
                    Incoming {
                        ipcp: i,
                        ipcp_handle,
                        conn,
                        local: local.clone(),
                        remote: remote.clone(),
                        qos,
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
            Event::RequestWithdrawn { handle } => {
                self.incoming
                    .retain(|_, inc| !(inc.ipcp == i && inc.ipcp_handle == handle));
            }
            Event::Allocated { port, max_sdu } => {
                if let Some((j, k)) = self.n1_pending.remove(&port) {
                    self.bind_n1(j, k, i, port);
                    return;
                }
                let Some(pa) = self.allocs.remove(&port) else {
                    self.ipcps[i].deallocate(now, port);
                    return;
                };
                if !self.conns.contains_key(&pa.conn) {
                    self.ipcps[i].deallocate(now, port);
                    return;
                }
                let info = FlowInfo {
                    port,
                    dif: self.ipcps[i].dif.clone(),
                    local: pa.local,
                    remote: pa.remote,
                    qos: pa.qos,
                    max_sdu,
                };
                match self.open_flow(i, pa.conn, info, pa.rings) {
                    Ok((info, app_end)) => {
                        info!(port, local = %info.local, remote = %info.remote, dif = %info.dif, "flow allocated");
                        self.reply(pa.conn, pa.id, Ok(Reply::Flow(info)), Some(app_end));
                    }
                    Err(e) => {
                        self.ipcps[i].deallocate(now, port);
                        self.reply(pa.conn, pa.id, Err(e), None);
                    }
                }
            }
            Event::AllocateFailed { port, error } => {
                if let Some((j, k)) = self.n1_pending.remove(&port) {
                    if let Some(n) = self.normal_mut(j) {
                        debug!(neighbor = %n.neighbors[k].name, %error, "N-1 flow failed; retrying");
                        n.neighbors[k].pending = None;
                    }
                    return;
                }
                if let Some(pa) = self.allocs.remove(&port) {
                    info!(port, %error, "allocation failed");
                    self.reply(pa.conn, pa.id, Err(ipcp::flow_error(error)), None);
                }
            }
            Event::Deallocated { port } => {
                if self.n1_owner.contains_key(&port) {
                    self.unbind_n1(port);
                    return;
                }
                info!(port, "flow deallocated by the peer");
                self.close_flow(port, false);
            }
            Event::NeighborSilent { port } => {
                // Tear the stale N-1 flow down; the side that sets it up
                // allocates a fresh one (a restarted peer accepts it).
                if let Some(&(_, lower)) = self.n1_owner.get(&port) {
                    warn!(port, "N-1 flow silent; setting it up again");
                    self.ipcps[lower].deallocate(now, port);
                    self.unbind_n1(port);
                }
            }
            Event::Transmit { port, frame } => self.n1_transmit(port, &frame),
            // Shims send their own datagrams in `Ipcp::poll_event`.
            Event::ToMedium { .. } => {}
            Event::Deliver { port, sdu } => {
                if let Some(&(j, _)) = self.n1_owner.get(&port) {
                    // An N-1 flow of a normal IPCP stacked on this one;
                    // congestion marks seen on it reach the DIF above.
                    let congested = match &mut self.ipcps[i].imp {
                        Imp::Normal(lower) => lower.machine.take_congested(port),
                        _ => false,
                    };
                    if let Imp::Normal(upper) = &mut self.ipcps[j].imp {
                        upper.machine.on_frame_marked(now, port, &sdu, congested);
                    }
                } else if matches!(self.ipcps[i].imp, Imp::ShimEth(_)) {
                    self.eth_deliver(i, port, &sdu);
                } else {
                    self.normal_deliver(i, port, sdu);
                }
            }
            Event::FlowFailed { port } => {
                warn!(port, "flow failed (its connection gave up); closing it");
                self.close_flow(port, true);
            }
        }
    }

    /// Makes the socket pair of an allocated flow and starts reading its
    /// daemon end.
    fn open_flow(
        &mut self,
        i: usize,
        owner: usize,
        info: FlowInfo,
        rings: bool,
    ) -> Result<(FlowInfo, OwnedFd), CtlError> {
        let pair = new_flow_pair(&self.system)?;
        self.open_flow_with(i, owner, info, rings, pair)
    }

    /// [`Daemon::open_flow`] with the flow's socket pair already made.
    fn open_flow_with(
        &mut self,
        i: usize,
        owner: usize,
        info: FlowInfo,
        rings: bool,
        (ours, theirs): (OwnedFd, OwnedFd),
    ) -> Result<(FlowInfo, OwnedFd), CtlError> {
        let port = info.port;
        self.poll
            .registry()
            .register(
                &mut SourceFd(&ours.as_raw_fd()),
                token(T_FLOW, port as usize),
                Interest::READABLE,
            )
            .map_err(|e| CtlError::new(ErrorKind::Internal, e.to_string()))?;
        if let Imp::Normal(n) = &mut self.ipcps[i].imp {
            let _ = n.machine.set_auto_consume(port, false);
        }
        let rings = if rings {
            let offered = matches!(self.ipcps[i].imp, Imp::ShimHv(_) | Imp::Normal(_));
            app_rings::AppRings::offer(ours.as_raw_fd(), offered).map_err(|e| {
                let _ = self
                    .poll
                    .registry()
                    .deregister(&mut SourceFd(&ours.as_raw_fd()));
                CtlError::new(
                    ErrorKind::NoResources,
                    format!("cannot set up the flow's rings: {e}"),
                )
            })?
        } else {
            None
        };
        self.flows.insert(
            port,
            FlowSlot {
                ipcp: i,
                fd: ours,
                info: info.clone(),
                owner,
                uid: self.conn_uid(owner),
                queued: false,
                rings,
            },
        );
        Ok((info, theirs))
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
            let now = self.now();
            self.ipcps[slot.ipcp].deallocate(now, port);
        }
    }

    fn free_port(&mut self) -> PortId {
        loop {
            let p = self.next_port;
            self.next_port = self.next_port.checked_add(1).unwrap_or(1);
            if !self.flows.contains_key(&p)
                && !self.allocs.contains_key(&p)
                && self.ipcps.iter().all(|ip| !ip.has_flow(p))
            {
                return p;
            }
        }
    }
}

/// The socket pair of a new flow; out of descriptors, an error that says so.
fn new_flow_pair(system: &str) -> Result<(OwnedFd, OwnedFd), CtlError> {
    sys::flow_pair(FLOW_SNDBUF).map_err(|e| {
        let why =
            if e.raw_os_error() == Some(libc::EMFILE) || e.raw_os_error() == Some(libc::ENFILE) {
                " (the daemon is at its limit of open descriptors)"
            } else {
                ""
            };
        CtlError::new(
            ErrorKind::NoResources,
            format!("system {system} cannot open a descriptor for the flow: {e}{why}"),
        )
    })
}

/// Largest PDU of a normal IPCP when the configuration does not say: room
/// for a 1400-byte SDU and more in one PDU, and small enough to travel in
/// one PDU of a normal DIF below with the same default.
const DEFAULT_MAX_PDU: u32 = 9000;

/// The key-pair authentication policy of a normal IPCP, if configured.
fn auth_keys(
    ic: &crate::config::IpcpConfig,
) -> Result<Option<rina_core::enrollment::AuthKeys>, DaemonError> {
    let name = ic.name.get_ref();
    let bad = |what: &str| DaemonError::Io {
        what: format!("IPCP {name}: {what}"),
        source: io::Error::other("expected 32 bytes as 64 hex digits"),
    };
    let parse = |s: &str, what: &str| -> Result<[u8; 32], DaemonError> {
        rina_core::enrollment::auth::unhex(s.trim())
            .and_then(|v| <[u8; 32]>::try_from(v).ok())
            .ok_or_else(|| bad(what))
    };
    let Some(key) = &ic.key else {
        if !ic.trusted_keys.is_empty() {
            return Err(bad("`trusted_keys` needs `key`"));
        }
        return Ok(None);
    };
    let secret = parse(key, "bad `key`")?;
    let trusted = ic
        .trusted_keys
        .iter()
        .map(|k| parse(k, "bad entry in `trusted_keys`"))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Some(rina_core::enrollment::AuthKeys::new(secret, trusted)))
}

/// A normal IPCP from its configuration (its neighbours are wired later,
/// once every shim exists).
fn new_normal(ic: &crate::config::IpcpConfig) -> Result<Ipcp, DaemonError> {
    use rina_core::normal::{NormalConfig, NormalIpcp};
    let name = ic.name.get_ref().clone();
    let app_name: AppName = name.parse().map_err(|e| DaemonError::Io {
        what: format!("IPCP {name}: its name is not a valid application name"),
        source: io::Error::other(format!("{e}")),
    })?;
    let mut nc = NormalConfig::new(ic.dif.clone(), ic.address.unwrap_or(0));
    let mut membership = rina_core::normal::MembershipConfig::new(app_name.clone());
    membership.password = ic.password.clone();
    membership.keys = auth_keys(ic)?;
    if let Some(k) = &membership.keys {
        // What the other members list in `trusted_keys`.
        tracing::info!(
            ipcp = %name,
            public_key = %rina_core::enrollment::auth::hex(&k.public_key()),
            "enrollment key pair"
        );
    }
    membership.entropy = crate::sys::random_seed().map_err(|source| DaemonError::Io {
        what: format!("IPCP {name}: no randomness for enrollment nonces"),
        source,
    })?;
    nc.membership = Some(membership);
    nc.dt.max_pdu_size = ic
        .max_pdu
        .as_ref()
        .map_or(DEFAULT_MAX_PDU, |m| *m.get_ref());
    if let Some(m) = &ic.max_sdu {
        nc.max_sdu = *m.get_ref() as usize;
    }
    nc.sdup.crc = ic.crc.unwrap_or(false);
    match ic.ecn_threshold {
        Some(0) => nc.ecn = None,
        Some(t) => {
            nc.ecn = Some(rina_core::rmt::EcnMarking {
                threshold: t,
                ..Default::default()
            })
        }
        None => {}
    }
    if ic.routing == Some(crate::config::RoutingKind::LinkState) {
        nc.routing = Some(rina_core::routing::Config::default());
    }
    if ic.directory_mode == Some(crate::config::DirectoryMode::Distributed) {
        nc.dynamic_directory = Some(rina_core::directory::Config::default());
    }
    nc.sdup.ttl = match ic.ttl {
        Some(0) => None,
        Some(t) => Some(t),
        None => nc.sdup.ttl,
    };
    nc.cubes = ic.cubes();
    if let Some(m) = ic.max_flows {
        nc.max_flows = m;
    }
    let sched_cfg = ic.scheduler_config();
    let sched = sched_cfg
        .build(&rina_core::normal::cubes::cu_map(&nc.cubes))
        .map_err(|e| DaemonError::Io {
            what: format!("IPCP {name}: scheduler"),
            source: io::Error::other(e.to_string()),
        })?;
    let mut machine = NormalIpcp::new(nc, sched).map_err(|e| DaemonError::Io {
        what: format!("IPCP {name}"),
        source: io::Error::other(e.to_string()),
    })?;
    for (app, &addr) in &ic.names {
        machine.set_directory(app.clone(), addr);
    }
    info!(ipcp = %name, dif = %ic.dif, address = ic.address.unwrap_or(0), neighbors = ic.neighbors.len(),
        "normal IPCP up");
    Ok(Ipcp {
        name,
        dif: ic.dif.clone(),
        imp: Imp::Normal(Box::new(NormalIo {
            machine,
            app_name,
            neighbors: Vec::new(),
            routes: ic
                .routes
                .iter()
                .filter_map(|(d, &h)| d.parse().ok().map(|d| (d, h)))
                .collect(),
            names: Default::default(),
            rx_pending: HashMap::new(),
            tx_stash: BTreeMap::new(),
            drops_in: HashMap::new(),
            drops_out: HashMap::new(),
            mgmt_unhandled: 0,
            sched: sched_cfg,
        })),
    })
}

/// Gives every normal IPCP its neighbours and registers its name in the
/// shims that reach them; returns who owns those registrations.
fn wire_normals(
    cfg: &Config,
    ipcps: &mut [Ipcp],
) -> Result<HashMap<(usize, AppName), usize>, DaemonError> {
    let mut owned = HashMap::new();
    for (j, ic) in cfg.ipcps.iter().enumerate() {
        if ic.kind != IpcpKind::Normal {
            continue;
        }
        let mut neighbors = Vec::new();
        for nb in &ic.neighbors {
            let over = nb.over.get_ref();
            let Some(shim) = ipcps
                .iter()
                .position(|ip| &ip.dif == over && ip.dif != ic.dif)
            else {
                continue;
            };
            neighbors.push(Neighbor {
                name: nb.name.clone(),
                address: nb.address,
                shim,
                port: None,
                pending: None,
                retry_at: None,
            });
        }
        let frame = match &ipcps[j].imp {
            Imp::Normal(n) => n.machine.max_frame(),
            _ => continue,
        };
        for nb in &neighbors {
            let lower = &ipcps[nb.shim];
            let max = lower.max_sdu();
            if frame > max {
                return Err(DaemonError::Io {
                    what: format!(
                        "IPCP {}: its frames of up to {frame} bytes do not fit the SDUs of DIF {} (at most {max}); lower its max_pdu",
                        ic.name.get_ref(),
                        lower.dif
                    ),
                    source: io::Error::other("configuration"),
                });
            }
        }
        let Imp::Normal(n) = &mut ipcps[j].imp else {
            continue;
        };
        let me = n.app_name.clone();
        let shims: std::collections::BTreeSet<usize> = neighbors.iter().map(|nb| nb.shim).collect();
        n.neighbors = neighbors;
        for shim in shims {
            ipcps[shim]
                .register(me.clone())
                .map_err(|e| DaemonError::Io {
                    what: format!("IPCP {}: cannot register in DIF {}", me, ipcps[shim].dif),
                    source: io::Error::other(e.to_string()),
                })?;
            owned.insert((shim, me.clone()), j);
        }
    }
    Ok(owned)
}

pub(super) enum FlowService {
    Drained,
    More,
    Closed,
}
