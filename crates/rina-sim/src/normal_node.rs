//! A simulated system running one unchanged normal IPCP
//! ([`rina_core::normal::NormalIpcp`]) directly over emulated links (each
//! link end is one N-1 port), with a small in-sim application layer:
//! registered names that accept, refuse or ignore flow requests (as
//! [`crate::ShimNode`] has), and per flow scripted SDU streams, optional
//! echo, optional slow reading, and a log of every SDU delivered.

use crate::shim_node::{App, Policy};
use crate::world::{Ctx, Node};
use rina_core::normal::{
    Action, FlowId, MembershipEvent, N1Port, NormalError, NormalIpcp, RibReadError,
};
use rina_core::rmt::Address;
use rina_core::Instant;
use rina_wire::{AppName, QosSpec};
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::time::Duration;

/// A scripted application action.
#[derive(Debug, Clone)]
pub enum NormalCommand {
    /// Write `count` SDUs of `len` bytes on `flow`, tagged with consecutive
    /// numbers from 0, one every `interval` (zero: as fast as flow control
    /// allows). SDUs that flow control refuses wait and are retried.
    Stream {
        flow: FlowId,
        count: u64,
        len: usize,
        interval: Duration,
    },
    /// The application of `flow` reads one delivered SDU (flows set to
    /// manual consumption only).
    Consume { flow: FlowId },
    /// Flip one bit in each of the next `n` frames this node receives.
    CorruptNextRx(usize),
    /// Allocate flow `flow` from `local` to `remote` by name.
    Allocate {
        flow: FlowId,
        local: AppName,
        remote: AppName,
        qos: QosSpec,
    },
    /// Deallocate flow `flow`.
    Deallocate { flow: FlowId },
    /// Register `name`, answering flow requests as `app` says.
    Register { name: AppName, app: App },
    /// Unregister `name`.
    Unregister { name: AppName },
    /// The N-1 flow on `port` leads to the IPCP at `neighbor` with link
    /// cost `cost`: tell the IPCP ([`NormalIpcp::neighbor_up`]).
    NeighborUp {
        port: N1Port,
        neighbor: Address,
        cost: u32,
    },
    /// The N-1 flow on `port` is gone: the IPCP is told
    /// ([`NormalIpcp::neighbor_down`], [`NormalIpcp::remove_port`]) and the
    /// node neither sends nor receives on that link end any more.
    PortDown(N1Port),
    /// The link end of `port` goes silent: nothing is sent or received on
    /// it any more, and the IPCP is not told (a crashed peer, a cable cut
    /// without carrier loss). Only the IPCP's own liveness checks notice.
    Silence(N1Port),
    /// A link end silenced by [`NormalCommand::Silence`] carries frames
    /// again.
    Resume(N1Port),
    /// N-1 port `port` is (again) the link end `local`, whose far end is
    /// `peer` (a link taken down with [`NormalCommand::PortDown`] comes
    /// back): the IPCP gets the port ([`NormalIpcp::add_port`]); its
    /// neighbour is announced apart ([`NormalCommand::NeighborUp`]) or found
    /// by hellos.
    PortUp {
        port: N1Port,
        local: SocketAddr,
        peer: SocketAddr,
    },
    /// Read the RIB of neighbour `neighbor` (IPCP name or address) under
    /// `path`, `depth` levels deep ([`NormalIpcp::read_remote_rib`]); the
    /// outcome is [`NormalEvent::RibRead`] (or [`NormalEvent::ReadRibFailed`]).
    ReadRib {
        neighbor: String,
        path: String,
        depth: Option<u32>,
    },
}

/// What a node reports for the trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NormalEvent {
    /// An SDU was delivered on `flow`, with its tag and length.
    Delivered { flow: FlowId, tag: u64, len: usize },
    /// A flow's connection failed.
    Failed { flow: FlowId },
    /// A flow request arrived for a registered name.
    FlowRequest {
        handle: u64,
        local: AppName,
        remote: AppName,
    },
    /// The application accepted request `handle` as flow `flow`.
    Accepted { handle: u64, flow: FlowId },
    /// The application refused request `handle`.
    Refused { handle: u64 },
    /// The IPCP withdrew request `handle` (no answer in time, or unregistered).
    Withdrawn { handle: u64 },
    /// A flow this node asked for exists.
    Allocated { flow: FlowId, max_sdu: u32 },
    /// A flow this node asked for could not be set up.
    AllocateFailed { flow: FlowId, error: NormalError },
    /// The peer deallocated the flow.
    Deallocated { flow: FlowId },
    /// A register command failed.
    RegisterFailed(NormalError),
    /// Membership news of the IPCP (neighbours, enrollment).
    Membership(MembershipEvent),
    /// A read of a neighbour's RIB ended.
    RibRead {
        handle: u64,
        result: Result<Vec<rina_wire::ctl::RibObjectInfo>, RibReadError>,
    },
    /// A read of a neighbour's RIB could not start.
    ReadRibFailed(NormalError),
}

/// One SDU handed to an in-sim application.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivery {
    /// When it was delivered.
    pub at: Instant,
    /// Its tag (first 8 bytes, big-endian).
    pub tag: u64,
    /// Its length.
    pub len: usize,
}

/// The in-sim application of one flow.
#[derive(Debug, Default)]
pub struct FlowApp {
    /// SDUs delivered, in order of delivery.
    pub delivered: Vec<Delivery>,
    /// Whether it writes every SDU back.
    pub echo: bool,
    /// SDUs written so far.
    pub written: u64,
    /// Writes refused by flow control (each retried later).
    pub blocked: u64,
    /// Delivered but not yet read (manual consumption).
    pub unread: usize,
    /// Largest `unread` seen.
    pub max_unread: usize,
    /// When the last SDU of the stream was written.
    pub stream_done_at: Option<Instant>,
    /// The connection failed.
    pub failed: bool,
    /// When the flow was allocated (asked for here) or accepted (asked for
    /// by the peer, whose application name is in `accepted_from`).
    pub allocated_at: Option<Instant>,
    /// The application that asked for the flow, if this end accepted it.
    pub accepted_from: Option<AppName>,
    /// When and why its allocation failed.
    pub alloc_failed: Option<(Instant, NormalError)>,
    /// When it was deallocated, by either end.
    pub deallocated_at: Option<Instant>,
    stream: Option<Stream>,
}

#[derive(Debug, Clone, Copy)]
struct Stream {
    next_tag: u64,
    count: u64,
    len: usize,
    interval: Duration,
    next_at: Instant,
    /// Refused by flow control: retried when the node next runs, not on a timer.
    waiting: bool,
}

/// A simulated system with one normal IPCP.
#[derive(Debug)]
pub struct NormalNode {
    ipcp: NormalIpcp,
    ports: BTreeMap<N1Port, (SocketAddr, SocketAddr)>,
    /// Link ends silenced by a command (their IPCP port still exists).
    silenced: BTreeMap<N1Port, (SocketAddr, SocketAddr)>,
    by_addr: HashMap<SocketAddr, N1Port>,
    apps: BTreeMap<FlowId, FlowApp>,
    corrupt: usize,
    names: BTreeMap<AppName, App>,
    next_flow: FlowId,
}

/// Flow ids this node gives to flows it accepts start here (scripts choose
/// their own, smaller ids for the flows they allocate).
pub const FIRST_ACCEPTED_FLOW: FlowId = 1_000_000;

impl NormalNode {
    /// A node around `ipcp`, with no ports yet.
    pub fn new(ipcp: NormalIpcp) -> Self {
        NormalNode {
            ipcp,
            ports: BTreeMap::new(),
            silenced: BTreeMap::new(),
            by_addr: HashMap::new(),
            apps: BTreeMap::new(),
            corrupt: 0,
            names: BTreeMap::new(),
            next_flow: FIRST_ACCEPTED_FLOW,
        }
    }

    /// Attaches N-1 port `port` to the link end `local`, whose far end is `peer`.
    pub fn attach(&mut self, port: N1Port, local: SocketAddr, peer: SocketAddr) {
        self.ports.insert(port, (local, peer));
        self.by_addr.insert(local, port);
        self.ipcp.add_port(port);
    }

    /// The link ends attached now (not down, not silenced):
    /// (port, local end, far end), in port order.
    pub fn link_ends(&self) -> Vec<(N1Port, SocketAddr, SocketAddr)> {
        self.ports.iter().map(|(p, (l, r))| (*p, *l, *r)).collect()
    }

    /// The IPCP.
    pub fn ipcp(&self) -> &NormalIpcp {
        &self.ipcp
    }

    /// The IPCP, to open flows or change routes.
    pub fn ipcp_mut(&mut self) -> &mut NormalIpcp {
        &mut self.ipcp
    }

    /// The application of `flow` (created on first use).
    pub fn app_mut(&mut self, flow: FlowId) -> &mut FlowApp {
        self.apps.entry(flow).or_default()
    }

    /// The application of `flow`.
    pub fn app(&self, flow: FlowId) -> Option<&FlowApp> {
        self.apps.get(&flow)
    }

    /// Every flow's application, by flow id.
    pub fn apps(&self) -> &BTreeMap<FlowId, FlowApp> {
        &self.apps
    }

    /// Flows this node accepted, in the order it accepted them.
    pub fn accepted_flows(&self) -> Vec<FlowId> {
        self.apps
            .iter()
            .filter(|(_, a)| a.accepted_from.is_some())
            .map(|(f, _)| *f)
            .collect()
    }

    /// Registers `name` at once (between runs), answering requests as `app`
    /// says. Registering never makes the IPCP act.
    pub fn register(&mut self, name: AppName, app: App) -> Result<(), NormalError> {
        self.ipcp.register(name.clone())?;
        self.names.insert(name, app);
        Ok(())
    }

    fn on_flow_request(
        &mut self,
        ctx: &mut Ctx<'_, NormalEvent>,
        handle: u64,
        local: AppName,
        remote: AppName,
    ) {
        let now = ctx.now();
        ctx.record(NormalEvent::FlowRequest {
            handle,
            local: local.clone(),
            remote: remote.clone(),
        });
        let app = self.names.get(&local).cloned().unwrap_or_else(App::ignore);
        match app.policy {
            Policy::Accept => {
                let flow = self.next_flow;
                self.next_flow += 1;
                match self.ipcp.accept(now, handle, flow) {
                    Ok(_) => {
                        ctx.record(NormalEvent::Accepted { handle, flow });
                        let a = self.apps.entry(flow).or_default();
                        a.allocated_at = Some(now);
                        a.accepted_from = Some(remote);
                        a.echo = app.echo;
                    }
                    Err(error) => ctx.record(NormalEvent::AllocateFailed { flow, error }),
                }
            }
            Policy::Refuse(reason) => {
                if self.ipcp.refuse(handle, &reason).is_ok() {
                    ctx.record(NormalEvent::Refused { handle });
                }
            }
            Policy::Ignore => {}
        }
    }

    fn pump(&mut self, ctx: &mut Ctx<'_, NormalEvent>) {
        let now = ctx.now();
        loop {
            let mut progress = false;
            // Streams write while flow control lets them.
            let ids: Vec<FlowId> = self.apps.keys().copied().collect();
            for id in ids {
                progress |= self.write_stream(now, id);
            }
            while let Some(a) = self.ipcp.poll_action() {
                progress = true;
                self.on_action(ctx, a);
            }
            if !progress {
                break;
            }
        }
    }

    fn write_stream(&mut self, now: Instant, id: FlowId) -> bool {
        let Some(app) = self.apps.get_mut(&id) else {
            return false;
        };
        let mut wrote = false;
        while let Some(s) = app.stream.as_mut() {
            if s.next_tag >= s.count || s.next_at > now {
                break;
            }
            let mut sdu = vec![0u8; s.len];
            let tag = s.next_tag.to_be_bytes();
            let n = s.len.min(8);
            sdu[..n].copy_from_slice(&tag[..n]);
            match self.ipcp.write(now, id, &sdu) {
                Ok(()) => {
                    wrote = true;
                    s.waiting = false;
                    app.written += 1;
                    s.next_tag += 1;
                    s.next_at = now + s.interval;
                    if s.next_tag == s.count {
                        app.stream_done_at = Some(now);
                    }
                }
                Err(NormalError::WouldBlock(_)) => {
                    app.blocked += 1;
                    s.waiting = true;
                    break;
                }
                Err(_) => {
                    app.stream = None;
                    break;
                }
            }
        }
        wrote
    }

    fn on_action(&mut self, ctx: &mut Ctx<'_, NormalEvent>, a: Action) {
        let now = ctx.now();
        match a {
            Action::Transmit { port, frame } => {
                if let Some(&(local, peer)) = self.ports.get(&port) {
                    ctx.transmit(local, peer, frame.into_vec());
                }
            }
            Action::Deliver { flow, sdu } => {
                let sdu = sdu.into_buf();
                let mut t = [0u8; 8];
                let n = sdu.len().min(8);
                t[..n].copy_from_slice(&sdu[..n]);
                let tag = u64::from_be_bytes(t);
                let app = self.apps.entry(flow).or_default();
                app.delivered.push(Delivery {
                    at: now,
                    tag,
                    len: sdu.len(),
                });
                app.unread += 1;
                app.max_unread = app.max_unread.max(app.unread);
                let echo = app.echo;
                ctx.record(NormalEvent::Delivered {
                    flow,
                    tag,
                    len: sdu.len(),
                });
                if echo {
                    let _ = self.ipcp.write(now, flow, &sdu);
                }
            }
            Action::Management { .. } => {}
            Action::RibRead { handle, result } => {
                ctx.record(NormalEvent::RibRead { handle, result })
            }
            Action::Membership(ev) => ctx.record(NormalEvent::Membership(*ev)),
            Action::FlowFailed { flow, .. } => {
                self.apps.entry(flow).or_default().failed = true;
                ctx.record(NormalEvent::Failed { flow });
            }
            Action::FlowRequest {
                handle,
                local,
                remote,
                ..
            } => self.on_flow_request(ctx, handle, *local, *remote),
            Action::RequestWithdrawn { handle } => {
                ctx.record(NormalEvent::Withdrawn { handle });
            }
            Action::Allocated { flow, max_sdu } => {
                ctx.record(NormalEvent::Allocated { flow, max_sdu });
                self.apps.entry(flow).or_default().allocated_at = Some(now);
            }
            Action::AllocateFailed { flow, error } => {
                let error = *error;
                ctx.record(NormalEvent::AllocateFailed {
                    flow,
                    error: error.clone(),
                });
                self.apps.entry(flow).or_default().alloc_failed = Some((now, error));
            }
            Action::Deallocated { flow } => {
                ctx.record(NormalEvent::Deallocated { flow });
                let a = self.apps.entry(flow).or_default();
                a.deallocated_at = Some(now);
                a.stream = None;
            }
        }
    }
}

impl Node for NormalNode {
    type Command = NormalCommand;
    type Event = NormalEvent;

    fn addrs(&self) -> Vec<SocketAddr> {
        self.by_addr.keys().copied().collect()
    }

    fn on_datagram(
        &mut self,
        ctx: &mut Ctx<'_, NormalEvent>,
        to: SocketAddr,
        _from: SocketAddr,
        payload: &[u8],
    ) {
        let Some(&port) = self.by_addr.get(&to) else {
            return;
        };
        if self.corrupt > 0 && !payload.is_empty() {
            self.corrupt -= 1;
            let mut bad = payload.to_vec();
            let i = bad.len() / 2;
            bad[i] ^= 0x10;
            self.ipcp.on_frame(ctx.now(), port, &bad);
        } else {
            self.ipcp.on_frame(ctx.now(), port, payload);
        }
        self.pump(ctx);
    }

    fn on_timeout(&mut self, ctx: &mut Ctx<'_, NormalEvent>) {
        self.ipcp.handle_timeout(ctx.now());
        self.pump(ctx);
    }

    fn on_command(&mut self, ctx: &mut Ctx<'_, NormalEvent>, cmd: NormalCommand) {
        let now = ctx.now();
        match cmd {
            NormalCommand::Stream {
                flow,
                count,
                len,
                interval,
            } => {
                self.apps.entry(flow).or_default().stream = Some(Stream {
                    next_tag: 0,
                    count,
                    len,
                    interval,
                    next_at: now,
                    waiting: false,
                });
            }
            NormalCommand::Consume { flow } => {
                let app = self.apps.entry(flow).or_default();
                if app.unread > 0 {
                    app.unread -= 1;
                    let _ = self.ipcp.consume(now, flow, 1);
                }
            }
            NormalCommand::CorruptNextRx(n) => self.corrupt += n,
            NormalCommand::Allocate {
                flow,
                local,
                remote,
                qos,
            } => {
                self.apps.entry(flow).or_default();
                if let Err(error) = self.ipcp.allocate(now, flow, local, remote, qos) {
                    // Found at once: reported like a failure found later.
                    ctx.record(NormalEvent::AllocateFailed {
                        flow,
                        error: error.clone(),
                    });
                    self.apps.entry(flow).or_default().alloc_failed = Some((now, error));
                }
            }
            NormalCommand::Deallocate { flow } => {
                if self.ipcp.deallocate(now, flow).is_ok() {
                    let a = self.apps.entry(flow).or_default();
                    a.deallocated_at = Some(now);
                    a.stream = None;
                }
            }
            NormalCommand::Register { name, app } => {
                if let Err(e) = self.register(name, app) {
                    ctx.record(NormalEvent::RegisterFailed(e));
                }
            }
            NormalCommand::Unregister { name } => {
                self.names.remove(&name);
                self.ipcp.unregister(&name);
            }
            NormalCommand::NeighborUp {
                port,
                neighbor,
                cost,
            } => self.ipcp.neighbor_up(now, port, neighbor, cost),
            NormalCommand::ReadRib {
                neighbor,
                path,
                depth,
            } => {
                if let Err(e) = self.ipcp.read_remote_rib(now, &neighbor, &path, depth) {
                    ctx.record(NormalEvent::ReadRibFailed(e));
                }
            }
            NormalCommand::Silence(port) => {
                if let Some((local, peer)) = self.ports.remove(&port) {
                    self.by_addr.remove(&local);
                    self.silenced.insert(port, (local, peer));
                }
            }
            NormalCommand::Resume(port) => {
                if let Some((local, peer)) = self.silenced.remove(&port) {
                    self.attach(port, local, peer);
                }
            }
            NormalCommand::PortUp { port, local, peer } => {
                self.silenced.remove(&port);
                self.attach(port, local, peer);
            }
            NormalCommand::PortDown(port) => {
                self.ipcp.neighbor_down(now, port);
                self.ipcp.remove_port(port);
                if let Some((local, _)) = self.ports.remove(&port) {
                    self.by_addr.remove(&local);
                }
            }
        }
        self.pump(ctx);
    }

    fn poll_timeout(&self) -> Option<Instant> {
        let streams = self.apps.values().filter_map(|a| {
            a.stream
                .filter(|s| s.next_tag < s.count && !s.interval.is_zero() && !s.waiting)
                .map(|s| s.next_at)
        });
        self.ipcp.poll_timeout().into_iter().chain(streams).min()
    }
}
