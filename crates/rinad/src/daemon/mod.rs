//! The event loop of `rinad`: one thread, one `mio::Poll`, one
//! [`System`].
//!
//! The daemon is drivers around the core's [`System`], which holds every
//! IPC process of the host, the resource allocator (which N-1 flows exist,
//! lanes, retries, silent neighbours) and the applications' flows as
//! ports. This module does IO and bookkeeping of the control protocol
//! only: it feeds the system what arrives (with the time) and carries out
//! its [`Output`]s — frames for a medium, SDUs and news for applications.
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
//! time (and an application flow of a normal IPCP at most [`BUDGET_BYTES`])
//! and then requeued, so one busy flow cannot starve the others.
//! Back-pressure: when a medium cannot take a frame, its driver keeps it
//! and tells the system ([`System::medium_blocked`]): the application flows
//! straight on that shim stop being read (their writes block in their own
//! socket buffers) and the N-1 ports over it hold their PDUs in the RMT
//! above, where the scheduling policy decides. An SDU a normal flow cannot
//! take waits in the daemon until the system says the flow is writable.
//! Nothing waits unbounded: a control client's requests are not read
//! while more than [`CONN_REPLIES_MAX`] answers or [`CONN_REPLY_BYTES`] wait
//! for it to read them, and a client whose queue still reaches
//! [`CONN_QUEUE_MAX`] messages (events, answers of operations under way)
//! is disconnected.

mod access;
mod app_rings;
mod build;
mod bundle;
mod busy_poll;
mod capture;
mod control;
mod direct;
mod held;
mod ipcp;
mod link_watch;
mod manage;
mod memory;
mod normal;
mod reload;
mod runtime;
mod shim;
mod shim_eth;
mod shim_hv;
mod to_sockets;

use crate::config::Config;
use crate::sys::{self, Recv, Sent};
use held::HeldQueue;
use ipcp::{Io, Ipcp};
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};
use rina_core::ids::IdMap;
use rina_core::normal::RibReadError;
use rina_core::sdu::Sdu;
use rina_core::system::{AppEvent, Machine, Output, PortId, System};
use rina_core::Instant;
use rina_wire::ctl::{
    self, AutoAccept, CtlError, DifInfo, ErrorKind, FlowInfo, FlowStats, IncomingFlow, IpcpInfo,
    Message, NameInfo, Op, Reply, Request, RibObjectInfo,
};
use rina_wire::AppName;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io::{self, Read};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;
use tracing::{debug, info, warn};

/// Packets served from one source before the others get a turn.
pub const BUDGET: usize = 64;
/// Bytes of application SDUs taken from one flow of a normal IPCP before
/// the others get a turn. The RMT sends at most
/// [`rina_core::normal::TX_BURST`] (256) PDUs per port per turn; 256 KiB is
/// 180 PDUs of a DIF with 1,450-byte PDUs, so a writer of large SDUs cannot
/// put more into the RMT's queue in a turn than it sends, and overflow it
/// on its own (64 SDUs of 64 KiB were 2,900 PDUs in a turn).
pub const BUDGET_BYTES: usize = 256 << 10;
/// Answers queued for a control client above which its requests are left
/// unread until it reads them (back-pressure; events do not count).
pub const CONN_REPLIES_MAX: usize = 16;
/// Bytes of answers queued for a control client above which its requests
/// are left unread.
pub const CONN_REPLY_BYTES: usize = 256 << 10;
/// Messages queued for a control client before it is disconnected (a last
/// resort: events and answers to requests still under way).
pub const CONN_QUEUE_MAX: usize = 1024;
/// Bytes queued for a control client before it is disconnected.
pub const CONN_QUEUE_BYTES: usize = 16 << 20;
/// Events (flow requests, flows accepted for the client, withdrawals)
/// queued for a control client above which no more are queued for it: flow
/// requests are refused to the requester (also those the daemon would
/// accept for it), withdrawals left out (accepting a withdrawn request is
/// refused with the reason). Requests come from the network, as many as
/// anybody sends; a client that does not read them for a while keeps its
/// connection (and its registrations) instead of reaching
/// [`CONN_QUEUE_MAX`].
pub const CONN_EVENTS_MAX: usize = CONN_QUEUE_MAX / 2;
/// Control connections served at once; more are closed on arrival.
pub const MAX_CONNS: usize = 1024;
/// Names one control connection may hold registered.
pub const MAX_NAMES_PER_CONN: usize = 256;
/// Wait before accepting again after the daemon ran out of descriptors.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);
/// Control connections accepted in one turn of the loop at most: a flood
/// of connections does not hold the loop in `accept` (the rest wait for
/// the next turn).
const ACCEPTS_PER_TURN: usize = 64;
/// Bytes kept free in front of every SDU so lower layers can prepend headers.
const HEADROOM: usize = 64;
/// Send buffer asked for on each flow socket.
const FLOW_SNDBUF: usize = 1 << 20;

const LISTENER: Token = Token(0);
const SIGNAL: Token = Token(1);
const HUP: Token = Token(2);
const LINKS: Token = Token(3);
const SHIFT: u32 = 40;
const T_UDP: usize = 1;
const T_CONN: usize = 2;
const T_FLOW: usize = 3;
const T_ETH: usize = 4;
/// A `rinactl capture`'s socket ([`capture`]), by the capture's number.
const T_CAPTURE: usize = 5;
/// A flow bundle's socket ([`bundle`]), by the bundle's number.
const T_BUNDLE: usize = 6;

fn token(kind: usize, id: usize) -> Token {
    Token((kind << SHIFT) | id)
}

fn untoken(t: Token) -> (usize, usize) {
    (t.0 >> SHIFT, t.0 & ((1 << SHIFT) - 1))
}

/// The daemon's end of an allocated flow.
struct FlowSlot {
    /// The IPCP (member of the system) that carries it.
    ipcp: usize,
    /// The daemon's end of the flow's socket; none for a flow in a bundle.
    fd: Option<OwnedFd>,
    /// The bundle that carries the flow instead ([`bundle`]).
    bundle: Option<u32>,
    /// A bundled flow its application closed (with an end frame, or by
    /// closing the bundle) while SDUs it wrote still waited for the window.
    app_closed: bool,
    /// Of a bundled flow: frames read from the bundle behind `tx_stash`,
    /// in order ([`bundle`]).
    held_back: VecDeque<Vec<u8>>,
    /// What the application was told about the flow.
    info: FlowInfo,
    /// The control connection that allocated or accepted it.
    owner: usize,
    /// The user of that connection: who may list and deallocate the flow.
    uid: u32,
    /// Already in the ready queue.
    queued: bool,
    /// Shared-memory rings with the application (flows on shim-hv,
    /// shim-udp and normal IPCPs that asked). Boxed: most flows have none,
    /// and an idle flow's slot stays small.
    rings: Option<Box<app_rings::AppRings>>,
    /// SDUs delivered but not yet taken by the application (its socket or
    /// its ring), each still in the buffers it arrived in.
    rx_pending: HeldQueue<Sdu>,
    /// An SDU read from the application that the flow could not take yet:
    /// reading waits for [`AppEvent::Writable`]. An application that
    /// closes the flow meanwhile is told to the system, which closes the
    /// flow itself if that event does not come in time
    /// ([`rina_core::system::System::app_closed`]).
    tx_stash: Option<Vec<u8>>,
    /// SDUs dropped because the application did not read.
    drops_in: u64,
    /// Registered for writability: its socket was full with SDUs held.
    wants_writable: bool,
    /// Ended by the peer, and kept open to the application until it has
    /// taken the SDUs held for it ([`Daemon::peer_ended`]).
    ended: bool,
    /// SDUs the application wrote that could not be sent.
    drops_out: u64,
    /// A direct flow's UDP socket (the application holds it too; `fd` is
    /// then the flow's lifeline).
    direct: Option<OwnedFd>,
    /// The identity of the application's end of the flow socket
    /// ([`sys::socket_key`]), by which [`Op::FlowBySocket`] finds the flow.
    ///
    /// [`Op::FlowBySocket`]: rina_wire::ctl::Op::FlowBySocket
    app_end: Option<(u64, u64)>,
}

impl FlowSlot {
    fn new(
        ipcp: usize,
        fd: Option<OwnedFd>,
        info: FlowInfo,
        owner: usize,
        uid: u32,
        bundle: Option<u32>,
    ) -> FlowSlot {
        FlowSlot {
            ipcp,
            fd,
            bundle,
            app_closed: false,
            held_back: VecDeque::new(),
            info,
            owner,
            uid,
            queued: false,
            rings: None,
            rx_pending: HeldQueue::default(),
            wants_writable: false,
            ended: false,
            tx_stash: None,
            drops_in: 0,
            drops_out: 0,
            direct: None,
            app_end: None,
        }
    }

    /// The daemon's end of the flow's socket (none for a bundled flow).
    fn sock(&self) -> Option<std::os::fd::RawFd> {
        self.fd.as_ref().map(|f| f.as_raw_fd())
    }

    /// Whether the application has closed its end (its socket hung up, or
    /// it closed the bundled flow).
    fn app_gone(&self) -> bool {
        match &self.fd {
            Some(fd) => sys::peer_hung_up(fd.as_raw_fd()),
            None => self.app_closed,
        }
    }
}

/// A control connection.
struct Conn {
    fd: OwnedFd,
    /// Messages waiting for the client to read: bytes, descriptors, and
    /// whether it answers a request (a reply or progress; else an event).
    out: VecDeque<(Vec<u8>, Vec<OwnedFd>, bool)>,
    out_bytes: usize,
    /// Of `out`, the answers to requests and their bytes: while they are
    /// over [`CONN_REPLIES_MAX`] or [`CONN_REPLY_BYTES`], the client's
    /// requests are not read.
    replies: usize,
    reply_bytes: usize,
    names: Vec<(usize, AppName)>,
    /// Who connected.
    cred: sys::PeerCred,
    /// Whether that is an administrator ([`access`]).
    admin: bool,
    /// When it last sent a request (or connected).
    last_seen: Instant,
    /// Flows it allocated or accepted that are still open (counted, so
    /// that finding idle connections does not walk every flow).
    flows: usize,
}

/// An allocation waiting for the peer's answer.
struct PendingAlloc {
    /// The IPCP that allocates it (set when the allocation starts).
    ipcp: usize,
    conn: usize,
    /// The user of `conn`, charged for the flow ([`access`]).
    uid: u32,
    id: u64,
    local: AppName,
    remote: AppName,
    qos: rina_wire::QosSpec,
    /// The application asked for shared-memory rings.
    rings: bool,
    /// The application asked for a direct flow: its socket, once made.
    direct: bool,
    direct_sock: Option<std::net::UdpSocket>,
    /// Into this bundle of the connection ([`bundle`]).
    bundle: Option<u32>,
}

/// The holder of a registered name: its control connection, and how the
/// daemon accepts flows for it if the registration asked it to.
#[derive(Clone, Copy)]
struct Owner {
    conn: usize,
    accept: Option<AutoAccept>,
}

/// An incoming flow request waiting for an application's answer (keyed by
/// the system's handle).
struct Incoming {
    ipcp: usize,
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
    /// Every IPCP's machine, the resource allocator and the flows' ports.
    sys: System,
    /// Per member of `sys` (same index): its name and driver.
    ipcps: Vec<Ipcp>,
    /// Boxed: the table's spare room costs a pointer per slot, not a slot.
    /// Keyed by ports this system hands out: FxHash (see `rina_core::ids`);
    /// it is looked up several times per SDU.
    flows: IdMap<PortId, Box<FlowSlot>>,
    conns: HashMap<usize, Conn>,
    next_conn: usize,
    /// Who holds each registered name, per IPCP.
    owners: HashMap<(usize, AppName), Owner>,
    allocs: HashMap<PortId, PendingAlloc>,
    /// Reads of neighbours' RIBs under way: (IPCP, handle) -> (control
    /// connection, request id) to answer.
    rib_reads: HashMap<(usize, u64), (usize, u64)>,
    incoming: HashMap<u64, Incoming>,
    ready_flows: VecDeque<PortId>,
    ready_media: VecDeque<usize>,
    closing: Vec<usize>,
    accept_retry: Option<Instant>,
    /// Who may do what on the control socket.
    access: access::Access,
    /// When to look for idle control connections next.
    idle_sweep: Instant,
    /// SDUs applications took, per flow, not yet reported to the system.
    taken: IdMap<PortId, usize>,
    /// Socket flows given SDUs by the outputs being carried out: they go
    /// out together at the end ([`to_sockets`]).
    to_sockets: Vec<PortId>,
    /// The `sendmmsg` buffers for them.
    socket_batch: to_sockets::SendBatch,
    /// Flow bundles ([`bundle`]), by number.
    bundles: HashMap<u32, bundle::Bundle>,
    /// Flows in bundles (of `flows`: those without a descriptor).
    bundled: usize,
    next_bundle: u32,
    /// Bundles whose sockets are readable, to serve in turn.
    ready_bundles: VecDeque<u32>,
    /// Bundles whose sockets failed in this turn, to close at its end.
    broken_bundles: Vec<u32>,
    /// `rinactl capture`s running ([`capture`]).
    captures: capture::Captures,
    /// Enrollments clients wait for ([`runtime`]).
    enrolls: Vec<runtime::PendingEnroll>,
    /// The configuration file, read again by `rinactl reload` and SIGHUP.
    config_path: PathBuf,
    /// The `[system]` table in force (`name` and `socket` as started).
    system_cfg: crate::config::System,
    /// A self-pipe written by the SIGHUP handler.
    hup_rx: UnixStream,
    buf: Vec<u8>,
    udp: shim::UdpShared,
    ctl_buf: Vec<u8>,
    /// Most flows held since memory was last given back ([`memory`]).
    flows_peak: usize,
    /// When to give memory back, after many flows closed.
    trim_at: Option<Instant>,
    /// Polling on without sleeping after events (`busy_poll_us`).
    busy: busy_poll::BusyPoll,
    /// The kernel's link announcements, if the socket could be opened
    /// ([`link_watch`]).
    links: Option<link_watch::LinkWatch>,
}

impl Daemon {
    /// Binds every socket of the configuration. Fails if another daemon
    /// already serves `socket_path`.
    pub fn new(
        cfg: &Config,
        config_path: PathBuf,
        socket_path: PathBuf,
    ) -> Result<Daemon, DaemonError> {
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
        let path = socket_path.clone();
        let built = Self::listening(cfg, config_path, socket_path, poll, access, listener);
        if built.is_err() {
            // Nobody will answer on it: a client would find a socket file
            // that refuses it, and the next start would have to remove it.
            let _ = std::fs::remove_file(&path);
        }
        built
    }

    /// The rest of [`Daemon::new`] once it listens on `socket_path`: the
    /// socket's access, signals, the system with its media.
    fn listening(
        cfg: &Config,
        config_path: PathBuf,
        socket_path: PathBuf,
        poll: Poll,
        access: access::Access,
        listener: OwnedFd,
    ) -> Result<Daemon, DaemonError> {
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
        let (hup_rx, hup_tx) = UnixStream::pair().map_err(io_ctx("signal pipe"))?;
        hup_rx
            .set_nonblocking(true)
            .map_err(io_ctx("signal pipe"))?;
        signal_hook::low_level::pipe::register(signal_hook::consts::SIGHUP, hup_tx)
            .map_err(io_ctx("cannot install signal handler"))?;
        poll.registry()
            .register(&mut SourceFd(&hup_rx.as_raw_fd()), HUP, Interest::READABLE)
            .map_err(io_ctx("poll register"))?;

        let links = link_watch::open_registered(&poll, LINKS);
        let (mut sys, ipcps) = build::system(cfg, &poll)?;
        // A reader that does not read stops its sender (flow control)
        // instead of losing SDUs in the daemon.
        sys.set_credit_on_read(true);
        let fds = sys::raise_fd_limit();
        let mut access = access;
        access.set_fd_limit(&cfg.system, fds);
        info!(system = %cfg.system.name, socket = %socket_path.display(), ipcps = ipcps.len(), fd_limit = fds, busy_poll_us = cfg.system.busy_poll().map_or(0, |d| d.as_micros() as u64), "rinad ready");
        let mut d = Daemon {
            system: cfg.system.name.clone(),
            poll,
            start: std::time::Instant::now(),
            listener,
            socket_path,
            signal_rx,
            sys,
            ipcps,
            flows: IdMap::default(),
            conns: HashMap::new(),
            next_conn: 1,
            owners: HashMap::new(),
            allocs: HashMap::new(),
            rib_reads: HashMap::new(),
            incoming: HashMap::new(),
            ready_flows: VecDeque::new(),
            ready_media: VecDeque::new(),
            closing: Vec::new(),
            accept_retry: None,
            access,
            idle_sweep: Instant::from_nanos(0),
            taken: IdMap::default(),
            to_sockets: Vec::new(),
            socket_batch: to_sockets::SendBatch::default(),
            captures: capture::Captures::default(),
            bundles: HashMap::new(),
            bundled: 0,
            next_bundle: 1,
            ready_bundles: VecDeque::new(),
            broken_bundles: Vec::new(),
            enrolls: Vec::new(),
            config_path,
            system_cfg: cfg.system.clone(),
            hup_rx,
            buf: vec![0; HEADROOM + 65_536 + 1],
            udp: shim::UdpShared::default(),
            ctl_buf: vec![0; ctl::MAX_CTL_MSG],
            flows_peak: 0,
            trim_at: None,
            busy: busy_poll::BusyPoll::new(cfg.system.busy_poll()),
            links,
        };
        d.drain_outputs();
        Ok(d)
    }

    fn now(&self) -> Instant {
        Instant::from_nanos(self.start.elapsed().as_nanos() as u64)
    }

    /// Runs until SIGINT or SIGTERM.
    pub fn run(mut self) -> Result<(), DaemonError> {
        let mut events = Events::with_capacity(256);
        loop {
            let timeout = if !self.ready_flows.is_empty()
                || !self.ready_media.is_empty()
                || !self.ready_bundles.is_empty()
            {
                Some(Duration::ZERO)
            } else {
                let now = self.now();
                self.sys
                    .poll_timeout()
                    .into_iter()
                    .chain(self.accept_retry)
                    .chain(Some(self.idle_sweep))
                    .chain(self.hv_timeout())
                    .chain(self.eth_timeout())
                    .chain(self.enrolls.iter().map(|e| e.deadline()).min())
                    .chain(self.trim_at)
                    .min()
                    .map(|t| t.saturating_since(now))
            };
            let wait = self.busy.plan(timeout, std::time::Instant::now());
            let res = match wait {
                busy_poll::Wait::Spin => self.poll.poll(&mut events, Some(Duration::ZERO)),
                busy_poll::Wait::Sleep(t) => self.poll.poll(&mut events, t),
            };
            if let Err(e) = res {
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(DaemonError::Io {
                    what: "poll".into(),
                    source: e,
                });
            }
            if events.is_empty() && wait == busy_poll::Wait::Spin {
                std::thread::yield_now();
                continue;
            }
            if !events.is_empty() {
                self.busy.saw_events(std::time::Instant::now());
            }
            let mut stop = false;
            for ev in events.iter() {
                match ev.token() {
                    LISTENER => self.accept_conns(),
                    SIGNAL => stop = true,
                    HUP => self.on_hup(),
                    LINKS => self.on_link_news(),
                    t => match untoken(t) {
                        (T_UDP, i) => {
                            if ev.is_writable() {
                                self.unstall(i);
                            }
                            if ev.is_readable() {
                                self.mark_medium_ready(i);
                            }
                        }
                        (T_ETH, i) => {
                            if ev.is_writable() {
                                self.eth_unstall(i);
                            }
                            if ev.is_readable() {
                                self.mark_medium_ready(i);
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
                                self.flush_rx(port as PortId);
                            }
                            if ev.is_readable() || ev.is_read_closed() {
                                self.mark_flow_ready(port as PortId);
                            }
                        }
                        (T_CAPTURE, id) => self.capture_news(id),
                        (T_BUNDLE, b) => {
                            if ev.is_writable() {
                                self.bundle_writable(b as u32);
                            }
                            if ev.is_readable() || ev.is_read_closed() {
                                self.mark_bundle_ready(b as u32);
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
            if self.sys.poll_timeout().is_some_and(|t| t <= now) {
                self.sys.handle_timeout(now);
            }
            self.hv_ticks(now);
            self.eth_link_checks(now);
            if !self.enrolls.is_empty() {
                self.enroll_deadlines(now);
            }
            self.drain_outputs();
            self.close_broken_bundles();
            self.drain_captures();
            for id in std::mem::take(&mut self.closing) {
                self.close_conn(id);
            }
            self.trim_memory(now);
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
        self.drain_outputs();
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

    fn mark_medium_ready(&mut self, i: usize) {
        let Some(queued) = self.ipcps.get_mut(i).and_then(|ip| ip.io.rx_queued()) else {
            return;
        };
        if !*queued {
            *queued = true;
            self.ready_media.push_back(i);
        }
    }

    fn service_ready(&mut self) {
        for _ in 0..self.ready_media.len() {
            let Some(i) = self.ready_media.pop_front() else {
                break;
            };
            if let Some(q) = self.ipcps[i].io.rx_queued() {
                *q = false;
            }
            let more = match self.ipcps[i].io {
                Io::Udp(_) => self.service_udp(i),
                Io::Eth(_) => self.service_eth(i),
                Io::Hv(_) => self.service_hv(i),
                Io::Normal(_) | Io::Removed => false,
            };
            self.drain_outputs();
            if more {
                self.mark_medium_ready(i);
            }
        }
        for _ in 0..self.ready_flows.len() {
            let Some(port) = self.ready_flows.pop_front() else {
                break;
            };
            if let Some(slot) = self.flows.get_mut(&port) {
                slot.queued = false;
            }
            let served = self.service_flow(port);
            self.drain_outputs();
            match served {
                FlowService::Drained => {}
                FlowService::More => self.mark_flow_ready(port),
                FlowService::Closed => self.close_flow(port, true),
            }
            self.close_if_taken(port);
        }
        if !self.ready_bundles.is_empty() {
            self.service_bundles();
        }
    }

    /// Reads up to [`BUDGET`] SDUs the application wrote on flow `port` and
    /// hands them to the system (or, on a shim, straight to the medium).
    fn service_flow(&mut self, port: PortId) -> FlowService {
        let Some(slot) = self.flows.get(&port) else {
            return FlowService::Drained;
        };
        if slot.bundle.is_some() {
            return self.service_bundled_flow(port);
        }
        match self.ipcps[slot.ipcp].io {
            Io::Normal(_) => self.service_normal_flow(port),
            Io::Hv(_) => self.service_hv_flow(port),
            Io::Udp(_) | Io::Eth(_) if slot.rings.is_some() => self.service_shim_rings(port),
            Io::Udp(_) | Io::Eth(_) => self.service_shim_flow(port),
            Io::Removed => FlowService::Closed,
        }
    }

    // ---- what the system asks for ----------------------------------------

    /// Carries out the system's outputs until there are none, reporting
    /// the SDUs applications took on the way (their credit).
    fn drain_outputs(&mut self) {
        loop {
            while let Some(o) = self.sys.poll_output() {
                self.on_output(o);
            }
            for port in std::mem::take(&mut self.to_sockets) {
                self.send_held(port);
            }
            // Applications sleeping on their rings, woken once for all the
            // SDUs just delivered to them.
            if !self.udp.woken.is_empty() {
                shim::wake_apps(&self.flows, &mut self.udp.woken);
            }
            if !self.udp.dirty.is_empty() {
                for i in std::mem::take(&mut self.udp.dirty) {
                    match self.ipcps[i].io {
                        Io::Eth(_) => self.flush_eth(i),
                        _ => self.flush_udp(i),
                    }
                }
                continue;
            }
            if self.taken.is_empty() {
                break;
            }
            let now = self.now();
            for (port, n) in std::mem::take(&mut self.taken) {
                self.sys.consumed(now, port, n);
            }
        }
    }

    fn on_output(&mut self, o: Output) {
        match o {
            Output::ToMedium {
                medium,
                peer,
                frame,
            } => match self.ipcps.get(medium).map(|ip| &ip.io) {
                Some(Io::Udp(_)) => self.udp_send(medium, peer, frame),
                Some(Io::Eth(_)) => self.eth_send(medium, frame),
                Some(Io::Hv(_)) => self.hv_send(medium, frame),
                _ => {}
            },
            Output::ToApp { port, sdu } => self.deliver(port, sdu),
            Output::App(ev) => self.on_app_event(ev),
            Output::Membership { member, event } => {
                if let Some(ip) = self.ipcps.get(member) {
                    ipcp::log_membership(&ip.name, &event);
                }
                if !self.enrolls.is_empty() {
                    self.enroll_news(member, &event);
                }
                if let rina_core::normal::MembershipEvent::NeighborDown { port, .. } = *event {
                    warn!(port, "N-1 flow silent; setting it up again");
                }
            }
            Output::RibRead {
                member,
                handle,
                result,
            } => {
                let result = result.map_err(|e| {
                    let kind = match &e {
                        RibReadError::Timeout { .. } => ErrorKind::Timeout,
                        RibReadError::Refused(_) => ErrorKind::Refused,
                        RibReadError::TooLarge { .. } => ErrorKind::NoResources,
                    };
                    CtlError::new(kind, e.to_string())
                });
                self.rib_read_done(member, handle, result)
            }
            Output::Alarm {
                member,
                neighbor,
                message,
            } => {
                let ipcp = self.ipcps.get(member).map_or("?", |ip| ip.name.as_str());
                tracing::error!(ipcp, %neighbor, error = %message, "N-1 flows not set up");
            }
        }
    }

    fn on_app_event(&mut self, ev: AppEvent) {
        let now = self.now();
        match ev {
            AppEvent::FlowRequest {
                handle,
                dif,
                local,
                remote,
                qos,
            } => {
                let (local, remote, qos) = (*local, *remote, *qos);
                let owner = self
                    .ipcps
                    .iter()
                    .enumerate()
                    .filter(|(_, ip)| ip.dif == dif)
                    .find_map(|(i, _)| self.owners.get(&(i, local.clone())).map(|&o| (i, o)));
                let Some((i, Owner { conn, accept })) = owner else {
                    let _ = self
                        .sys
                        .refuse(now, handle, "no application holds the name");
                    return;
                };
                if self.conns.get(&conn).is_some_and(Conn::events_full) {
                    debug!(ipcp = %self.ipcps[i].name, %local, %remote, handle,
                        "flow request refused: its application does not read its requests");
                    let _ = self.sys.refuse(
                        now,
                        handle,
                        "the application does not read its flow requests",
                    );
                    return;
                }
                self.incoming.insert(
                    handle,
                    Incoming {
                        ipcp: i,
                        conn,
                        local: local.clone(),
                        remote: remote.clone(),
                        qos,
                    },
                );
                debug!(ipcp = %self.ipcps[i].name, %local, %remote, handle, "incoming flow request");
                if let Some(a) = accept {
                    self.accept_for(conn, handle, a);
                    return;
                }
                let msg = Message::FlowRequest(IncomingFlow {
                    handle,
                    dif,
                    local,
                    remote,
                    qos,
                });
                self.send_msg(conn, &msg, Vec::new());
            }
            AppEvent::RequestWithdrawn { handle } => {
                // Its application hears of it, so that it does not accept
                // a request that is gone.
                // One that does not read them learns when it accepts.
                if let Some(inc) = self.incoming.remove(&handle) {
                    if !self.conns.get(&inc.conn).is_some_and(Conn::events_full) {
                        let msg = Message::RequestWithdrawn { handle };
                        self.send_msg(inc.conn, &msg, Vec::new());
                    }
                }
            }
            AppEvent::Allocated { port, max_sdu } => self.allocated(port, max_sdu),
            AppEvent::AllocateFailed { port, error } => {
                if let Some(pa) = self.allocs.remove(&port) {
                    self.access.discharge(pa.uid);
                    info!(port, %error, "allocation failed");
                    self.reply(pa.conn, pa.id, Err(ipcp::flow_error(error)), None);
                }
            }
            AppEvent::Deallocated { port } => {
                info!(
                    port,
                    "flow deallocated by the peer (or its connection failed, or what its \
                     application left unsent did not go in time after it closed it)"
                );
                self.peer_ended(port);
            }
            AppEvent::Writable { port } => self.on_writable(port),
            AppEvent::HoldExpired { port } => self.hold_expired(port),
        }
    }

    /// A read of a neighbour's RIB a client asked for is done: its reply.
    fn rib_read_done(
        &mut self,
        member: usize,
        handle: u64,
        result: Result<Vec<RibObjectInfo>, CtlError>,
    ) {
        let Some((conn, id)) = self.rib_reads.remove(&(member, handle)) else {
            return;
        };
        let reply = result.map(|objects| Reply::Rib { objects });
        if self.conns.contains_key(&conn) {
            self.reply(conn, id, reply, None);
        }
    }

    /// Flow `port` asked for by a client exists: its socket pair goes to
    /// the client with the reply.
    fn allocated(&mut self, port: PortId, max_sdu: u32) {
        let now = self.now();
        let Some(pa) = self.allocs.remove(&port) else {
            self.sys.close(now, port);
            return;
        };
        self.access.discharge(pa.uid);
        // The flow may be gone already (the peer deallocated it in the same
        // batch): the application gets it, then its end of file.
        let i = pa.ipcp;
        if !self.conns.contains_key(&pa.conn) {
            self.sys.close(now, port);
            return;
        }
        let info = FlowInfo {
            port,
            dif: self.ipcps[i].dif.clone(),
            local: pa.local,
            remote: pa.remote,
            qos: pa.qos,
            max_sdu,
            direct: false,
            bundle: None,
        };
        if let Some(b) = pa.bundle {
            match self.open_bundled_flow(i, pa.conn, info, b) {
                Ok(info) => {
                    info!(port, local = %info.local, remote = %info.remote, dif = %info.dif, bundle = b, "flow allocated");
                    self.reply(pa.conn, pa.id, Ok(Reply::Flow(info)), None);
                }
                Err(e) => {
                    self.sys.close(now, port);
                    self.reply(pa.conn, pa.id, Err(e), None);
                }
            }
            return;
        }
        // Direct if the peer agreed; the peer's application then writes to
        // this socket only, so a flow that cannot have it fails.
        if let (Some(sock), Some(peer)) = (pa.direct_sock, self.sys.direct_peer(port)) {
            let opened = Self::connect_direct(sock, peer)
                .ok_or_else(|| {
                    CtlError::new(
                        ErrorKind::Internal,
                        "cannot connect the direct flow's socket",
                    )
                })
                .and_then(|sock| Ok((sock, new_flow_pair(&self.system)?)))
                .and_then(|(sock, pair)| self.open_direct_flow(i, pa.conn, info, sock, pair));
            match opened {
                Ok((info, fds)) => {
                    info!(port, local = %info.local, remote = %info.remote, dif = %info.dif, "direct flow allocated");
                    self.send_msg(
                        pa.conn,
                        &Message::Reply {
                            id: pa.id,
                            result: Ok(Reply::Flow(info)),
                        },
                        fds,
                    );
                }
                Err(e) => {
                    self.warn_no_descriptor("a direct flow allocated", &e);
                    self.sys.close(now, port);
                    self.reply(pa.conn, pa.id, Err(e), None);
                }
            }
            return;
        }
        match self.open_flow(i, pa.conn, info, pa.rings) {
            Ok((info, app_end)) => {
                info!(port, local = %info.local, remote = %info.remote, dif = %info.dif, "flow allocated");
                self.reply(pa.conn, pa.id, Ok(Reply::Flow(info)), Some(app_end));
            }
            Err(e) => {
                self.warn_no_descriptor("a flow allocated", &e);
                self.sys.close(now, port);
                self.reply(pa.conn, pa.id, Err(e), None);
            }
        }
    }

    /// Flow `port` can take the SDU it refused: send what waited and read
    /// the application again.
    fn on_writable(&mut self, port: PortId) {
        let now = self.now();
        let Some(sdu) = self.flows.get_mut(&port).and_then(|s| s.tx_stash.take()) else {
            self.mark_flow_ready(port);
            return;
        };
        match self.sys.write(now, port, &sdu) {
            Ok(()) => self.mark_flow_ready(port),
            Err(rina_core::system::FlowError::WouldBlock) => {
                if let Some(s) = self.flows.get_mut(&port) {
                    s.tx_stash = Some(sdu);
                }
            }
            Err(_) => {
                if let Some(s) = self.flows.get_mut(&port) {
                    s.drops_out += 1;
                }
                self.mark_flow_ready(port);
            }
        }
    }

    /// Hands an SDU of flow `port` to its application (socket or ring), or
    /// holds it while the application does not read, as far as the system
    /// says it may ([`rina_core::system::System::may_hold`]: on a flow with
    /// window flow control, whose credit goes back once the application
    /// took an SDU, every one; on any other, up to a bound), else drops
    /// and counts it.
    fn deliver(&mut self, port: PortId, sdu: Sdu) {
        let Some(slot) = self.flows.get_mut(&port) else {
            return;
        };
        let sys = &self.sys;
        let full = |held: &HeldQueue<Sdu>| !sys.may_hold(port, held.len(), held.bytes());
        let taken = self.taken.entry(port).or_default();
        if let Some(r) = slot.rings.as_mut() {
            // A reassembled SDU is gathered from its fragments' buffers
            // straight into the ring.
            if slot.rx_pending.is_empty() && r.push_sdu(&sdu) {
                *taken += 1;
                // Woken once for what the outputs deliver ([`Daemon::drain_outputs`]).
                if self.udp.woken.last() != Some(&port) {
                    self.udp.woken.push(port);
                }
                return;
            }
            if full(&slot.rx_pending) {
                slot.drops_in += 1;
                *taken += 1;
                return;
            }
            slot.rx_pending.push_back(sdu);
            let room_now = slot
                .rx_pending
                .front()
                .is_some_and(|f| r.want_room(f.len()));
            if room_now {
                self.mark_flow_ready(port);
            }
            return;
        }
        if full(&slot.rx_pending) {
            slot.drops_in += 1;
            *taken += 1;
            return;
        }
        self.hold_for_socket(port, sdu);
    }

    /// Holds `sdu` for the socket of flow `port` (the caller checked the
    /// flow's bound): it goes out with the others of this batch, a full
    /// batch at once, or, while the socket is full, when it is writable.
    fn hold_for_socket(&mut self, port: PortId, sdu: Sdu) {
        let Some(slot) = self.flows.get_mut(&port) else {
            return;
        };
        if slot.app_closed {
            // A bundled flow its application closed, lingering for what it
            // wrote: nobody reads.
            slot.drops_in += 1;
            *self.taken.entry(port).or_default() += 1;
            return;
        }
        if slot.rx_pending.is_empty() && !slot.wants_writable {
            self.to_sockets.push(port);
        }
        slot.rx_pending.push_back(sdu);
        if !slot.wants_writable && slot.rx_pending.len() >= to_sockets::BATCH {
            self.send_held(port);
        }
    }

    /// The application's socket of flow `port` can take more: hand it the
    /// SDUs held for it.
    fn flush_rx(&mut self, port: PortId) {
        let Some(slot) = self.flows.get_mut(&port) else {
            return;
        };
        if matches!(self.ipcps[slot.ipcp].io, Io::Hv(_)) {
            self.hv_flush_rx(port);
        } else {
            self.send_held(port);
            self.drain_outputs();
        }
        self.close_if_taken(port);
    }

    /// The peer ended flow `port` (or its connection failed): the SDUs held
    /// for its application go where it reads, as many as fit. If some are
    /// left, the flow's end stays open to the application until it has
    /// taken them, and the system keeps the port meanwhile, for
    /// [`rina_core::system::ENDED_HOLD_MAX`] at most
    /// ([`rina_core::system::System::hold_ended`]); else, or if the
    /// application has closed its end (it reads no more), it closes now.
    /// What the application writes meanwhile is dropped and counted, and
    /// so is an SDU it wrote that waited for the window: reading its socket
    /// or ring waited for the flow to be writable, which it will never be,
    /// so it is read again (its close seen, its writes dropped).
    fn peer_ended(&mut self, port: PortId) {
        let Some(slot) = self.flows.get_mut(&port) else {
            return;
        };
        let bundle = slot.bundle;
        if slot.tx_stash.take().is_some() {
            slot.drops_out += 1;
            self.mark_flow_ready(port);
        }
        if let Some(b) = bundle {
            self.drop_held_back(b, port);
        }
        self.hand_over_held(port);
        let held = self.held_for_app(port);
        let gone = self.flows.get(&port).is_some_and(|s| s.app_gone());
        if held == 0 || gone {
            return self.close_flow(port, false);
        }
        let now = self.now();
        if !self.sys.hold_ended(now, port) {
            return self.close_flow(port, false);
        }
        if let Some(slot) = self.flows.get_mut(&port) {
            slot.ended = true;
        }
        info!(
            port,
            held, "the flow's end stays open until its application has taken what is held for it"
        );
    }

    /// Flow `port`, ended by its peer, closes once its application has
    /// taken every SDU held for it.
    fn close_if_taken(&mut self, port: PortId) {
        if self.flows.get(&port).is_some_and(|s| s.ended) && self.held_for_app(port) == 0 {
            self.close_flow(port, false);
        }
    }

    /// How many SDUs are held for the application of flow `port` (by the
    /// flow, or by its shim-hv IPCP).
    pub(super) fn held_for_app(&self, port: PortId) -> usize {
        let Some(slot) = self.flows.get(&port) else {
            return 0;
        };
        match &self.ipcps[slot.ipcp].io {
            Io::Hv(h) => h.held_for(port),
            _ => slot.rx_pending.len(),
        }
    }

    /// The application of flow `port`, ended by its peer, did not take what
    /// was held for it in time: the flow closes with it.
    fn hold_expired(&mut self, port: PortId) {
        if !self.flows.get(&port).is_some_and(|s| s.ended) {
            return;
        }
        self.hand_over_held(port);
        let lost = self.held_for_app(port);
        warn!(
            port,
            lost,
            "the application did not take what was held for its flow, ended by the peer, in time"
        );
        self.close_flow(port, false);
    }

    /// Before flow `port` closes, the SDUs held for its application go
    /// where it reads, as many as fit (its rings, or its socket), so that
    /// what the peer sent before it closed is not lost with the flow; the
    /// application reads them before it learns that the flow closed.
    /// (A shim-hv IPCP holds them for the flow; those of a flow with rings
    /// go when its application kicks.)
    fn hand_over_held(&mut self, port: PortId) {
        let Some(slot) = self.flows.get_mut(&port) else {
            return;
        };
        if matches!(self.ipcps[slot.ipcp].io, Io::Hv(_)) {
            return self.hv_flush_rx(port);
        }
        if slot.rx_pending.is_empty() {
            return;
        }
        match slot.rings.as_mut() {
            Some(r) => {
                r.deliver_held(&mut slot.rx_pending);
            }
            None => self.send_held(port),
        }
    }

    /// Sends the SDUs held for the application of socket flow `port`, as
    /// many as its socket takes; the flow waits to be writable while
    /// some are left.
    fn send_held(&mut self, port: PortId) {
        let Some(slot) = self.flows.get_mut(&port) else {
            return;
        };
        let Some(fd) = slot.fd.as_ref().map(|f| f.as_raw_fd()) else {
            return self.send_bundled(port);
        };
        let out = self.socket_batch.send(fd, &mut slot.rx_pending);
        slot.drops_in += out.dropped as u64;
        let interest = if out.blocked {
            Interest::READABLE | Interest::WRITABLE
        } else {
            Interest::READABLE
        };
        if out.blocked != slot.wants_writable {
            slot.wants_writable = out.blocked;
            let _ = self.poll.registry().reregister(
                &mut SourceFd(&fd),
                token(T_FLOW, port as usize),
                interest,
            );
        }
        *self.taken.entry(port).or_default() += out.taken + out.dropped;
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
        let rings = if rings {
            let offered = matches!(
                self.ipcps[i].io,
                Io::Hv(_) | Io::Normal(_) | Io::Udp(_) | Io::Eth(_)
            );
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
        let uid = self.conn_uid(owner);
        self.access.charge(uid);
        let mut slot = FlowSlot::new(i, Some(ours), info.clone(), owner, uid, None);
        slot.rings = rings.map(Box::new);
        slot.app_end = sys::socket_key(&theirs);
        self.flows.insert(port, Box::new(slot));
        if let Some(c) = self.conns.get_mut(&owner) {
            c.flows += 1;
        }
        Ok((info, theirs))
    }

    /// Forgets a flow; `tell_peer` deallocates it in the IPCP too.
    fn close_flow(&mut self, port: PortId, tell_peer: bool) {
        self.hand_over_held(port);
        let Some(slot) = self.flows.remove(&port) else {
            return;
        };
        if slot.ended {
            // The system forgot the flow when its peer ended it; only the
            // port was kept.
            self.sys.release_ended(port);
        }
        self.access.discharge(slot.uid);
        if let Some(d) = &slot.direct {
            direct::shut_direct(d);
        }
        if let Some(c) = self.conns.get_mut(&slot.owner) {
            c.flows = c.flows.saturating_sub(1);
        }
        if let Some(fd) = &slot.fd {
            let _ = self
                .poll
                .registry()
                .deregister(&mut SourceFd(&fd.as_raw_fd()));
            sys::close_quietly(fd);
        }
        if let Some(b) = slot.bundle {
            let freed = slot.held_back.iter().map(Vec::len).sum();
            self.bundled_flow_gone(b, port, !slot.app_closed, freed);
        }
        self.taken.remove(&port);
        if tell_peer && !slot.ended {
            info!(port, "flow closed by the application");
            let now = self.now();
            self.sys.close(now, port);
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

pub(super) enum FlowService {
    Drained,
    More,
    Closed,
}
