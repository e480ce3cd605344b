//! What the lab configures in every node's stack, decided once for every
//! backend: the real ones write it into `rinad` configuration files
//! ([`super::real::config`]), the simulator's protocol engine builds its
//! `rina-core` systems from it, and the queueing engine sizes its PDUs
//! with it. Whatever the experiment file does not say is the core's
//! standard member ([`NormalConfig::standard`], `rinad`'s defaults).
//!
//! One deliberate departure from those defaults: the lab's links are
//! Ethernet-like, with frames of at most [`LINK_MTU`] bytes, so a DIF with
//! adjacencies directly over links takes the largest PDU its shims carry
//! ([`max_pdu`]), derived from the shim's largest SDU as `rinad` refuses a
//! larger one (the same size in every member: enrollment compares it).
//! DIFs only over other DIFs keep the standard [`DEFAULT_MAX_PDU`] and are
//! fragmented by the DIF below when their PDUs are larger.

use crate::resolve::{Cube, Experiment, Link, Over};
use rina_core::efcp::EfcpConfig;
#[cfg(doc)]
use rina_core::normal::DEFAULT_MAX_PDU;
use rina_core::normal::{cubes::QosCube, NormalConfig};
use rina_core::rmt::PortRate;
use rina_core::{directory, routing};

pub use super::sim::LINK_OVERHEAD;

/// Largest SDU of a link's shim (the link's MTU), bytes: the shim-udp of
/// the simulator and of the real backends' UDP links is configured with it
/// (shim-eth's follows the interface's MTU, 1500 too).
pub const LINK_MTU: usize = 1500;

/// The share of a link's rate its shims pace at. Whatever makes the link
/// lose time (a late timer of the emulator: tbf's, the delay line's, the
/// relay's) is capacity it never gets back; at exactly the link's rate the
/// frames sent meanwhile would stay queued in the emulator for the rest of
/// the run, first come first served, where no RMT policy can reach them
/// (the urgent class of `qos-2` on `netns` once averaged 16.9 ms against
/// its 5.3 ms unloaded). A little under the rate, such a queue drains (3 %
/// of 10 Mb/s: a 1,000-byte frame in 27 ms) and the backlog stays in the
/// RMT, as shapers do in front of a bottleneck they do not control. The
/// simulator's links lose no time, but its shims pace the same, so that
/// it runs the stack the real backends configure.
pub const PACE_SHARE: f64 = 0.97;

/// The rate (bit/s) the shims of `link` pace their N-1 flows at, if the
/// link has one.
pub fn paced_rate_bps(link: &Link) -> Option<u64> {
    (link.rate_bps < crate::resolve::UNLIMITED_BPS).then_some((link.rate_bps * PACE_SHARE) as u64)
}

/// The pacing of the N-1 flows over `link`'s shim-udp, as `rinad` makes
/// it from the `rate` and `rate_overhead` the real backends write: the
/// paced rate, and per frame the link's [`LINK_OVERHEAD`] and the shim's
/// own header.
pub fn udp_port_rate(link: &Link) -> Option<PortRate> {
    paced_rate_bps(link).map(|r| {
        PortRate::new(r).overhead((LINK_OVERHEAD + rina_wire::shim_udp::DATA_HEADER_LEN) as u32)
    })
}

/// The largest PDU of DIF `d`, the same in every member, if it is not the
/// standard one: the file's `max_pdu`, lowered to what the shims of the
/// links its adjacencies cross carry (`shim_max_sdu(l)`: the largest SDU
/// of link `l`'s shim), with the DIF's SDU protection.
pub fn max_pdu(exp: &Experiment, d: usize, shim_max_sdu: &dyn Fn(usize) -> usize) -> Option<u32> {
    let dif = &exp.difs[d];
    let standard = NormalConfig::standard(dif.name.clone(), 0);
    let links = (0..exp.links.len())
        .filter(|&l| dif.adjacencies.iter().any(|a| a.over == Over::Link(l)))
        .map(|l| standard.max_pdu_within(shim_max_sdu(l)));
    match (dif.max_pdu, links.min()) {
        (Some(m), Some(l)) => Some(m.min(l)),
        (m, None) => m,
        (None, Some(l)) => Some(l.min(standard.dt.max_pdu_size)),
    }
}

/// The QoS cube `c` of DIF `d` as member `node` has it: its EFCP policies
/// over the reliable or unreliable defaults, its cell, its declared
/// figures, and the cube of each lower DIF it rides on, for the lower
/// DIFs this member has neighbours over (an HR of seed 003's SPN reaches
/// its PE over a link, not over MR).
pub fn cube(exp: &Experiment, node: usize, d: usize, c: &Cube) -> QosCube {
    let dif = &exp.difs[d];
    let mut efcp = if c.reliable {
        EfcpConfig::reliable()
    } else {
        EfcpConfig::unreliable()
    };
    // Checked when the experiment was resolved.
    let _ = c.efcp.apply(&mut efcp);
    let mut q = QosCube::new(c.id, c.name.clone(), efcp).with_cell(c.urgency, c.cherish);
    q.avg_bandwidth_bps = c.bandwidth_bps.map(|b| b as u64);
    q.delay_us = c.delay.map(|d| d.as_micros() as u64);
    q.loss_ppm = c.loss.map(|l| (l * 1e6) as u32);
    q.keepalive = c.keepalive;
    for (&l, &id) in &c.maps_to {
        let over_it = dif
            .adjacencies
            .iter()
            .any(|a| (a.a == node || a.b == node) && a.over == Over::Dif(l));
        let ld = &exp.difs[l];
        if let (true, Some(lc)) = (over_it, ld.cubes.iter().find(|lc| lc.id == id)) {
            q = q.over(ld.name.clone(), lc.name.clone());
        }
    }
    q
}

/// The machine configuration of `node`'s member of DIF `d` (without its
/// membership: names and password): the standard member, address 1 with
/// link-state routing and the disseminated directory at the DIF's
/// bootstrap member (the others enroll), the largest PDU of [`max_pdu`],
/// and the DIF's cubes.
pub fn member_config(
    exp: &Experiment,
    node: usize,
    d: usize,
    shim_max_sdu: &dyn Fn(usize) -> usize,
) -> NormalConfig {
    let dif = &exp.difs[d];
    let boot = dif.bootstrap == node;
    let mut c = NormalConfig::standard(dif.name.clone(), u64::from(boot));
    if let Some(m) = max_pdu(exp, d, shim_max_sdu) {
        c.dt.max_pdu_size = m;
    }
    if boot {
        c.routing = Some(routing::Config::default());
        c.dynamic_directory = Some(directory::Config::default());
    }
    c.cubes = dif.cubes.iter().map(|k| cube(exp, node, d, k)).collect();
    if c.cubes.is_empty() {
        c.cubes = QosCube::defaults();
    }
    c
}
