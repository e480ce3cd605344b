//! A simulated system running one unchanged [`ShimUdp`] machine, with a
//! small in-sim application layer on top: registered names with an
//! accept/refuse policy, optional echo, and a log of every flow.

use crate::world::{Ctx, Node};
use rina_core::shim_udp::{Action, Config, DropReason, PortId, Received, ShimError, ShimUdp};
use rina_core::Instant;
use rina_wire::{AppName, QosSpec};
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;

/// How an in-sim application answers incoming flow requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Policy {
    /// Accept every request.
    Accept,
    /// Refuse every request with this reason.
    Refuse(String),
    /// Never answer (the shim withdraws the request after its accept timeout).
    Ignore,
}

/// An application registered on a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct App {
    /// How it answers flow requests.
    pub policy: Policy,
    /// Whether it writes every SDU it receives back on the same flow.
    pub echo: bool,
}

impl App {
    /// Accepts flows and keeps what it receives.
    pub fn sink() -> Self {
        App {
            policy: Policy::Accept,
            echo: false,
        }
    }

    /// Accepts flows and echoes every SDU.
    pub fn echo() -> Self {
        App {
            policy: Policy::Accept,
            echo: true,
        }
    }

    /// Refuses every flow with `reason`.
    pub fn refuse(reason: &str) -> Self {
        App {
            policy: Policy::Refuse(reason.to_string()),
            echo: false,
        }
    }

    /// Never answers.
    pub fn ignore() -> Self {
        App {
            policy: Policy::Ignore,
            echo: false,
        }
    }
}

/// A scripted application action.
#[derive(Debug, Clone)]
pub enum Command {
    /// Allocate flow `port` from `local` to `remote`.
    Allocate {
        port: PortId,
        local: AppName,
        remote: AppName,
        qos: QosSpec,
    },
    /// Write an SDU of `len` bytes whose first 8 bytes (or fewer, if shorter)
    /// are `tag` in big-endian order and the rest zero.
    Write { port: PortId, len: usize, tag: u64 },
    /// Write this SDU.
    WriteBytes { port: PortId, sdu: Vec<u8> },
    /// Deallocate flow `port`.
    Deallocate { port: PortId },
    /// Register `name`.
    Register { name: AppName, app: App },
    /// Unregister `name`.
    Unregister { name: AppName },
}

/// What a shim node reports for the trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShimEvent {
    /// An application asked for a flow.
    AllocateAsked { port: PortId, remote: AppName },
    /// A flow request arrived for a registered name.
    FlowRequest {
        handle: u64,
        local: AppName,
        remote: AppName,
    },
    /// The application accepted request `handle` as flow `port`.
    Accepted { handle: u64, port: PortId },
    /// The application refused request `handle`.
    Refused { handle: u64 },
    /// The shim withdrew request `handle` (no answer in time, or unregistered).
    Withdrawn { handle: u64 },
    /// A flow this node asked for exists.
    Allocated { port: PortId, max_sdu: u32 },
    /// A flow this node asked for could not be set up.
    AllocateFailed { port: PortId, error: ShimError },
    /// The peer deallocated the flow.
    Deallocated { port: PortId },
    /// An SDU was delivered on `port`.
    Delivered { port: PortId, len: usize, tag: u64 },
    /// A write failed.
    WriteFailed { port: PortId, error: ShimError },
    /// The shim dropped a received datagram.
    Dropped(DropReason),
    /// A register or unregister command failed.
    RegisterFailed(ShimError),
}

/// One SDU delivered to an application.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivery {
    /// When.
    pub at: Instant,
    /// SDU length in bytes.
    pub len: usize,
    /// First 8 bytes, big-endian, zero-padded.
    pub tag: u64,
}

/// What happened to a flow of a node, as its application saw it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FlowLog {
    /// When the flow was allocated (asked for here) or accepted (asked for by
    /// the peer).
    pub allocated_at: Option<Instant>,
    /// When and why its allocation failed.
    pub failed: Option<(Instant, ShimError)>,
    /// When it was deallocated, by either end.
    pub deallocated_at: Option<Instant>,
    /// SDUs written on it (accepted by the shim).
    pub written: u64,
    /// SDUs delivered on it.
    pub delivered: Vec<Delivery>,
}

/// A system with one shim-udp IPCP at one fake address.
#[derive(Debug)]
pub struct ShimNode {
    addr: SocketAddr,
    shim: ShimUdp,
    apps: BTreeMap<AppName, App>,
    echo_ports: BTreeSet<PortId>,
    next_port: PortId,
    flows: BTreeMap<PortId, FlowLog>,
}

impl ShimNode {
    /// A node at `addr` running a shim configured with `cfg`.
    pub fn new(addr: SocketAddr, cfg: Config) -> Self {
        ShimNode {
            addr,
            shim: ShimUdp::new(cfg),
            apps: BTreeMap::new(),
            echo_ports: BTreeSet::new(),
            next_port: 1,
            flows: BTreeMap::new(),
        }
    }

    /// The node's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The shim machine.
    pub fn shim(&self) -> &ShimUdp {
        &self.shim
    }

    /// Registers `name` with `app` at once (between runs). Registering never
    /// makes the shim act, so no event needs processing.
    pub fn register(&mut self, name: AppName, app: App) -> Result<(), ShimError> {
        self.shim.register(name.clone())?;
        self.apps.insert(name, app);
        Ok(())
    }

    /// A fresh port-id for a flow of this node.
    pub fn reserve_port(&mut self) -> PortId {
        let p = self.next_port;
        self.next_port += 1;
        p
    }

    /// The log of flow `port`.
    pub fn flow(&self, port: PortId) -> Option<&FlowLog> {
        self.flows.get(&port)
    }

    /// All flow logs.
    pub fn flows(&self) -> &BTreeMap<PortId, FlowLog> {
        &self.flows
    }

    fn write(&mut self, ctx: &mut Ctx<'_, ShimEvent>, port: PortId, sdu: &[u8]) {
        match self.shim.send_header(port, sdu.len()) {
            Ok((to, hdr)) => {
                let mut dgram = Vec::with_capacity(hdr.len() + sdu.len());
                dgram.extend_from_slice(&hdr);
                dgram.extend_from_slice(sdu);
                ctx.transmit(self.addr, to, dgram);
                self.flows.entry(port).or_default().written += 1;
            }
            Err(error) => ctx.record(ShimEvent::WriteFailed { port, error }),
        }
    }

    /// Carries out everything the shim asks for.
    fn drain(&mut self, ctx: &mut Ctx<'_, ShimEvent>) {
        let now = ctx.now();
        while let Some(action) = self.shim.poll_action() {
            match action {
                Action::Transmit { to, payload } => ctx.transmit(self.addr, to, payload),
                Action::FlowRequest {
                    handle,
                    local,
                    remote,
                    ..
                } => {
                    ctx.record(ShimEvent::FlowRequest {
                        handle,
                        local: local.clone(),
                        remote,
                    });
                    let app = self.apps.get(&local).cloned().unwrap_or_else(App::ignore);
                    match app.policy {
                        Policy::Accept => {
                            let port = self.reserve_port();
                            match self.shim.accept(handle, port) {
                                Ok(_) => {
                                    ctx.record(ShimEvent::Accepted { handle, port });
                                    self.flows.entry(port).or_default().allocated_at = Some(now);
                                    if app.echo {
                                        self.echo_ports.insert(port);
                                    }
                                }
                                Err(error) => ctx.record(ShimEvent::AllocateFailed { port, error }),
                            }
                        }
                        Policy::Refuse(reason) => {
                            if self.shim.refuse(handle, &reason).is_ok() {
                                ctx.record(ShimEvent::Refused { handle });
                            }
                        }
                        Policy::Ignore => {}
                    }
                }
                Action::RequestWithdrawn { handle } => ctx.record(ShimEvent::Withdrawn { handle }),
                Action::Allocated { port, max_sdu } => {
                    ctx.record(ShimEvent::Allocated { port, max_sdu });
                    self.flows.entry(port).or_default().allocated_at = Some(now);
                }
                Action::AllocateFailed { port, error } => {
                    ctx.record(ShimEvent::AllocateFailed {
                        port,
                        error: error.clone(),
                    });
                    self.flows.entry(port).or_default().failed = Some((now, error));
                }
                Action::Deallocated { port } => {
                    ctx.record(ShimEvent::Deallocated { port });
                    self.flows.entry(port).or_default().deallocated_at = Some(now);
                    self.echo_ports.remove(&port);
                }
            }
        }
    }
}

fn tag_of(sdu: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    let n = sdu.len().min(8);
    b[..n].copy_from_slice(&sdu[..n]);
    u64::from_be_bytes(b)
}

impl Node for ShimNode {
    type Command = Command;
    type Event = ShimEvent;

    fn addrs(&self) -> Vec<SocketAddr> {
        vec![self.addr]
    }

    fn on_datagram(
        &mut self,
        ctx: &mut Ctx<'_, ShimEvent>,
        _to: SocketAddr,
        from: SocketAddr,
        payload: &[u8],
    ) {
        let mut echo = None;
        match self.shim.on_datagram(ctx.now(), from, payload) {
            Received::Deliver { port, sdu } => {
                let d = Delivery {
                    at: ctx.now(),
                    len: sdu.len(),
                    tag: tag_of(sdu),
                };
                ctx.record(ShimEvent::Delivered {
                    port,
                    len: d.len,
                    tag: d.tag,
                });
                self.flows.entry(port).or_default().delivered.push(d);
                if self.echo_ports.contains(&port) {
                    echo = Some((port, sdu.to_vec()));
                }
            }
            Received::Control => {}
            Received::Dropped(reason) => ctx.record(ShimEvent::Dropped(reason)),
        }
        if let Some((port, sdu)) = echo {
            self.write(ctx, port, &sdu);
        }
        self.drain(ctx);
    }

    fn on_timeout(&mut self, ctx: &mut Ctx<'_, ShimEvent>) {
        self.shim.handle_timeout(ctx.now());
        self.drain(ctx);
    }

    fn on_command(&mut self, ctx: &mut Ctx<'_, ShimEvent>, cmd: Command) {
        match cmd {
            Command::Allocate {
                port,
                local,
                remote,
                qos,
            } => {
                ctx.record(ShimEvent::AllocateAsked {
                    port,
                    remote: remote.clone(),
                });
                self.flows.entry(port).or_default();
                if let Err(error) = self.shim.allocate(ctx.now(), port, local, remote, qos) {
                    // Found at once: reported like a failure found later.
                    ctx.record(ShimEvent::AllocateFailed {
                        port,
                        error: error.clone(),
                    });
                    self.flows.entry(port).or_default().failed = Some((ctx.now(), error));
                }
            }
            Command::Write { port, len, tag } => {
                let mut sdu = vec![0u8; len];
                let n = len.min(8);
                sdu[..n].copy_from_slice(&tag.to_be_bytes()[..n]);
                self.write(ctx, port, &sdu);
            }
            Command::WriteBytes { port, sdu } => self.write(ctx, port, &sdu),
            Command::Deallocate { port } => {
                if self.shim.deallocate(ctx.now(), port).is_ok() {
                    self.flows.entry(port).or_default().deallocated_at = Some(ctx.now());
                    self.echo_ports.remove(&port);
                }
            }
            Command::Register { name, app } => {
                if let Err(e) = self.register(name, app) {
                    ctx.record(ShimEvent::RegisterFailed(e));
                }
            }
            Command::Unregister { name } => {
                self.apps.remove(&name);
                self.shim.unregister(&name);
            }
        }
        self.drain(ctx);
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.shim.poll_timeout()
    }
}
