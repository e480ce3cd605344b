//! The `local` backend: one `rinad` per node on loopback, no root.
//!
//! Every link is a shim-udp DIF of its own (named after the link) with one
//! shim IPCP per end; the two shims do not talk directly but through a UDP
//! relay in this process ([`real::relay`]) that emulates the link's rate,
//! delay, loss and queue and implements link down/up. The rest (configs,
//! enrollment, servers and clients, events, results) is [`real::run`].

use super::real;
use super::{Backend, RunCtx};
use crate::results::RunOutput;
use crate::{Experiment, LabError};
use real::relay::{LinkParams, Relay};
use real::{Fabric, ShimKind};
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::Ordering;

/// The `local` backend.
#[derive(Debug, Default)]
pub struct Local {}

impl Backend for Local {
    fn name(&self) -> &'static str {
        "local"
    }

    fn check(&self) -> Result<(), LabError> {
        real::Bins::find("local").map(|_| ())
    }

    fn run_once(&mut self, exp: &Experiment, ctx: &RunCtx<'_>) -> Result<RunOutput, LabError> {
        let mut fabric = Loopback::default();
        real::run(exp, ctx, &mut fabric)
    }
}

/// Links as relays on loopback.
#[derive(Default)]
struct Loopback {
    /// Per link: the shims' bind addresses (end A, end B).
    binds: Vec<(SocketAddr, SocketAddr)>,
    relays: Vec<Relay>,
    ends: Vec<(usize, usize)>,
}

/// A free UDP port on loopback, from below the kernel's ephemeral range
/// (the daemon binds it right after; see [`rina::ports`]).
fn free_port() -> Result<SocketAddr, LabError> {
    rina::ports::unused_loopback_udp_port()
        .map(|p| SocketAddr::from(([127, 0, 0, 1], p)))
        .map_err(|e| LabError::Backend {
            backend: "local",
            what: format!("no free UDP port on loopback: {e}"),
        })
}

impl Fabric for Loopback {
    fn name(&self) -> &'static str {
        "local"
    }

    fn setup(&mut self, exp: &Experiment, _dir: &Path) -> Result<(), LabError> {
        for (i, l) in exp.links.iter().enumerate() {
            let (a, b) = (free_port()?, free_port()?);
            let p = LinkParams {
                rate_bps: l.rate_bps,
                delay: l.delay,
                loss: l.loss,
                queue: l.queue,
                seed: super::sim::mix(exp.seed, 1000 + i as u64),
            };
            let r = Relay::start(p, a, b).map_err(|e| LabError::Backend {
                backend: "local",
                what: format!("link {}: {e}", l.name),
            })?;
            self.binds.push((a, b));
            self.relays.push(r);
            self.ends.push((l.a, l.b));
        }
        Ok(())
    }

    fn shim(&self, node: usize, link: usize) -> ShimKind {
        let (a, b) = self.binds[link];
        let r = &self.relays[link];
        if self.ends[link].0 == node {
            ShimKind::Udp {
                bind: a,
                peer: r.addr_a,
            }
        } else {
            ShimKind::Udp {
                bind: b,
                peer: r.addr_b,
            }
        }
    }

    fn command(&self, _node: usize, program: &Path) -> Command {
        Command::new(program)
    }

    fn traffic_starts(&self) {
        for r in &self.relays {
            r.set_lossy(true);
        }
    }

    fn set_link(&self, link: usize, up: bool) -> Result<(), LabError> {
        self.relays[link].set_up(up);
        Ok(())
    }

    fn link_counters(&self, link: usize) -> (u64, u64, u64) {
        let r = &self.relays[link];
        (
            r.ab.bytes.load(Ordering::Relaxed),
            r.ba.bytes.load(Ordering::Relaxed),
            r.ab.dropped.load(Ordering::Relaxed) + r.ba.dropped.load(Ordering::Relaxed),
        )
    }

    fn teardown(&mut self) {
        self.relays.clear();
    }
}
