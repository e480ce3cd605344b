//! A simulated system running one unchanged normal IPCP
//! ([`rina_core::normal::NormalIpcp`]) directly over emulated links (each
//! link end is one N-1 port), with a small in-sim application per flow:
//! scripted SDU streams, optional echo, optional slow reading, and a log of
//! every SDU delivered.

use crate::world::{Ctx, Node};
use rina_core::normal::{Action, FlowId, N1Port, NormalError, NormalIpcp};
use rina_core::Instant;
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
}

/// What a node reports for the trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NormalEvent {
    /// An SDU was delivered on `flow`, with its tag and length.
    Delivered { flow: FlowId, tag: u64, len: usize },
    /// A flow's connection failed.
    Failed { flow: FlowId },
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
    by_addr: HashMap<SocketAddr, N1Port>,
    apps: BTreeMap<FlowId, FlowApp>,
    corrupt: usize,
}

impl NormalNode {
    /// A node around `ipcp`, with no ports yet.
    pub fn new(ipcp: NormalIpcp) -> Self {
        NormalNode {
            ipcp,
            ports: BTreeMap::new(),
            by_addr: HashMap::new(),
            apps: BTreeMap::new(),
            corrupt: 0,
        }
    }

    /// Attaches N-1 port `port` to the link end `local`, whose far end is `peer`.
    pub fn attach(&mut self, port: N1Port, local: SocketAddr, peer: SocketAddr) {
        self.ports.insert(port, (local, peer));
        self.by_addr.insert(local, port);
        self.ipcp.add_port(port);
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
                    ctx.transmit(local, peer, frame);
                }
            }
            Action::Deliver { flow, sdu } => {
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
            Action::FlowFailed { flow, .. } => {
                self.apps.entry(flow).or_default().failed = true;
                ctx.record(NormalEvent::Failed { flow });
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
