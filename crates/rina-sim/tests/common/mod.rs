//! The set-up the normal-DIF simulation tests share: the members' base
//! configuration, the ideal link, and a mesh converged with an echo
//! application registered. Each test file compiles its own copy and uses
//! part of it.

#![allow(dead_code)]

use rina_core::normal::{MembershipConfig, NormalConfig};
use rina_core::sdup::SdupConfig;
use rina_core::{directory, routing, Instant};
use rina_sim::chain::{Chain, Mesh};
use rina_sim::{App, LinkConfig};
use rina_wire::{AppName, QosSpec};
use std::time::Duration;

pub const MS: Duration = Duration::from_millis(1);
pub const SEC: Duration = Duration::from_secs(1);

/// `n` ms after time zero.
pub fn at_ms(n: u64) -> Instant {
    Instant::ZERO + MS * n as u32
}

pub fn name(s: &str) -> AppName {
    s.parse().unwrap()
}

/// A 1 ms link without serialization delay (times are round figures),
/// queueing 10,000 PDUs.
pub fn ideal() -> LinkConfig {
    LinkConfig::ideal(MS).queue(10_000)
}

/// A 100 Mb/s link of 1 ms, queueing 10,000 PDUs.
pub fn link() -> LinkConfig {
    LinkConfig::new(100_000_000, MS).queue(10_000)
}

pub fn reliable() -> QosSpec {
    QosSpec {
        reliable: true,
        ..Default::default()
    }
}

/// Tags delivered on `flow` at chain node `i`.
pub fn tags(c: &Chain, i: usize, flow: u32) -> Vec<u64> {
    c.node(i)
        .app(flow)
        .map(|a| a.delivered.iter().map(|d| d.tag).collect())
        .unwrap_or_default()
}

/// A member of DIF `net` at `addr`: PDUs of at most 1400 bytes, TTL 64
/// and CRC; no routing, no disseminated directory.
pub fn base_cfg(addr: u64) -> NormalConfig {
    let mut c = NormalConfig::new("net", addr);
    c.dt.max_pdu_size = 1400;
    c.sdup = SdupConfig {
        ttl: Some(64),
        crc: true,
    };
    c
}

/// [`base_cfg`] with link-state routing (default policy).
pub fn routed_cfg(addr: u64) -> NormalConfig {
    let mut c = base_cfg(addr);
    c.routing = Some(routing::Config::default());
    c
}

/// [`routed_cfg`] with the disseminated directory (default policy).
pub fn dynamic_cfg(addr: u64) -> NormalConfig {
    let mut c = routed_cfg(addr);
    c.dynamic_directory = Some(directory::Config::default());
    c
}

/// Member `i` of a DIF that assembles itself ([`Mesh::enrolling`]): node
/// 0 bootstraps it ([`dynamic_cfg`] at address 1, the DIF's policies);
/// every other node ([`base_cfg`] at address 0) has only its name,
/// `ipcp-i`, and `password`, and enrolls.
pub fn member_cfg(i: usize, password: &str) -> NormalConfig {
    let mut c = if i == 0 { dynamic_cfg(1) } else { base_cfg(0) };
    let mut m = MembershipConfig::new(format!("ipcp-{i}").parse().unwrap());
    m.password = Some(password.into());
    c.membership = Some(m);
    c
}

/// `n` members joined along `edges` by links like `link`, each configured
/// by `cfg(address)`, run until routing converged (within 5 s of virtual
/// time); returns the mesh and when it converged.
pub fn converged_mesh(
    seed: u64,
    n: usize,
    edges: &[(usize, usize)],
    link: LinkConfig,
    cfg: impl Fn(u64) -> NormalConfig,
) -> (Mesh, Instant) {
    let mut m = Mesh::new(seed, n, edges, link, cfg);
    let t = m
        .run_until_converged(MS, Instant::ZERO + SEC * 5)
        .expect("converges");
    (m, t)
}

/// Like [`converged_mesh`], with an echo application registered as `app`
/// at `node` (in the disseminated directory) from the start, and a second
/// more after convergence for the name to spread; returns the mesh and
/// that time.
pub fn mesh_with_echo(
    seed: u64,
    n: usize,
    edges: &[(usize, usize)],
    link: LinkConfig,
    cfg: impl Fn(u64) -> NormalConfig,
    node: usize,
    app: &str,
) -> (Mesh, Instant) {
    let mut m = Mesh::new(seed, n, edges, link, cfg);
    m.register_dynamic(node, app, App::echo());
    let t = m
        .run_until_converged(MS, Instant::ZERO + SEC * 5)
        .expect("converges");
    m.world.run_until(t + SEC).unwrap();
    (m, t + SEC)
}
