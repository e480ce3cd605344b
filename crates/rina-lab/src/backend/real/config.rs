//! `rinad` configurations for the nodes of an experiment.
//!
//! Per node: one shim IPCP per link end (what kind is the backend's choice:
//! [`ShimKind`]), then one normal IPCP per DIF it is a member of, lower DIFs
//! first. A DIF's bootstrap member gets address 1, link-state routing and
//! the distributed directory; the others get no address and enroll, their
//! first neighbour being the one the experiment says they enroll through.
//! Every member gets the DIF's scheduler and QoS cubes. IPCPs are named
//! `<node>.<dif>`; a link's shim DIF is named after the link.

use crate::backend::sim::LINK_OVERHEAD;
use crate::resolve::{Dest, Over};
use crate::Experiment;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use toml::{Table, Value};

/// The shim of one link end.
#[derive(Debug, Clone)]
pub enum ShimKind {
    /// shim-udp bound at `bind`; every name on the other end is reached at
    /// `peer` (the link emulator's socket facing this end).
    Udp {
        /// Local address of the shim.
        bind: SocketAddr,
        /// Where the other end's names live.
        peer: SocketAddr,
    },
    /// shim-eth on `interface`, VLAN `vlan`, with user-space delay and
    /// loss in rinad's transmit path.
    Eth {
        /// Interface in the node's namespace.
        interface: String,
        /// VLAN id.
        vlan: u16,
        /// One-way delay, µs.
        delay_us: u64,
        /// Loss probability.
        loss: f64,
        /// Seed of the loss draws.
        seed: u64,
    },
}

/// Largest PDU of a normal DIF over shim-eth links (1500-byte MTU).
pub const ETH_MAX_PDU: u32 = 1495;

/// Name of the normal IPCP of `node` in DIF `dif`.
pub fn ipcp_name(exp: &Experiment, node: usize, dif: usize) -> String {
    format!("{}.{}", exp.nodes[node], exp.difs[dif].name)
}

/// Application names the server processes register at `node` on link
/// shims (flows directly over a link), by link.
pub type ShimApps = BTreeMap<usize, Vec<String>>;

/// The configuration of `node`. `shim(l)` gives the shim of link `l` at
/// this node; `shim_apps` the application names reached over each link
/// (registered at the other end).
pub fn node_config(
    exp: &Experiment,
    node: usize,
    socket: &Path,
    shim: &dyn Fn(usize) -> ShimKind,
    shim_apps: &ShimApps,
) -> String {
    let mut ipcps: Vec<Value> = Vec::new();
    for (l, link) in exp.links.iter().enumerate() {
        if link.a != node && link.b != node {
            continue;
        }
        let peer = if link.a == node { link.b } else { link.a };
        let mut t = Table::new();
        t.insert(
            "name".into(),
            format!("{}.{}", exp.nodes[node], link.name).into(),
        );
        t.insert("dif".into(), link.name.clone().into());
        let kind = shim(l);
        // The link's capacity: normal IPCPs above pace their N-1 flows at
        // it, so queues form in their RMT where the scheduling policy is.
        // The relay of `local` charges LINK_OVERHEAD per UDP payload; tbf
        // of `netns` counts the Ethernet frame, which rinad adds itself.
        if link.rate_bps < crate::resolve::UNLIMITED_BPS {
            t.insert("rate".into(), (link.rate_bps as i64).into());
            if matches!(kind, ShimKind::Udp { .. }) {
                t.insert("rate_overhead".into(), (LINK_OVERHEAD as i64).into());
            }
        }
        match kind {
            ShimKind::Udp { bind, peer: at } => {
                t.insert("type".into(), "shim-udp".into());
                t.insert("bind".into(), bind.to_string().into());
                let mut dir = Table::new();
                for (d, dif) in exp.difs.iter().enumerate() {
                    if dif
                        .adjacencies
                        .iter()
                        .any(|a| a.over == Over::Link(l) && (a.a == node || a.b == node))
                    {
                        dir.insert(ipcp_name(exp, peer, d), at.to_string().into());
                    }
                }
                for name in shim_apps.get(&l).into_iter().flatten() {
                    dir.insert(name.clone(), at.to_string().into());
                }
                t.insert("directory".into(), Value::Table(dir));
            }
            ShimKind::Eth {
                interface,
                vlan,
                delay_us,
                loss,
                seed,
            } => {
                t.insert("type".into(), "shim-eth".into());
                t.insert("interface".into(), interface.into());
                t.insert("vlan".into(), i64::from(vlan).into());
                if delay_us > 0 {
                    t.insert("tx_delay_us".into(), (delay_us as i64).into());
                }
                if loss > 0.0 {
                    t.insert("tx_loss".into(), loss.into());
                    t.insert("tx_seed".into(), ((seed >> 1) as i64).into());
                }
            }
        }
        ipcps.push(Value::Table(t));
    }
    for (d, dif) in exp.difs.iter().enumerate() {
        if !dif.has_member(node) {
            continue;
        }
        let mut t = Table::new();
        t.insert("name".into(), ipcp_name(exp, node, d).into());
        t.insert("type".into(), "normal".into());
        t.insert("dif".into(), dif.name.clone().into());
        if dif.bootstrap == node {
            t.insert("address".into(), 1.into());
            t.insert("routing".into(), "link-state".into());
            t.insert("directory_mode".into(), "distributed".into());
        }
        if let Some(p) = &dif.password {
            t.insert("password".into(), p.clone().into());
        }
        // Over shim-eth links the frames must fit the interface's MTU:
        // 1496-byte SDUs, a PDU costing one byte more. The max PDU size is
        // part of the DIF's wire profile, which enrollment checks, so it
        // is the same in every member: the smaller one if any adjacency of
        // the DIF crosses a shim-eth link, even where this member's own do
        // not (seed 003's PEs whose SPN neighbours are all over the MR DIF
        // were refused with 9000 against the others' 1495).
        let over_eth = (0..exp.links.len()).any(|l| {
            dif.adjacencies.iter().any(|a| a.over == Over::Link(l))
                && matches!(shim(l), ShimKind::Eth { .. })
        });
        let max_pdu = match (dif.max_pdu, over_eth) {
            (Some(m), true) => Some(m.min(ETH_MAX_PDU)),
            (None, true) => Some(ETH_MAX_PDU),
            (m, false) => m,
        };
        if let Some(m) = max_pdu {
            t.insert("max_pdu".into(), i64::from(m).into());
        }
        if let Ok(v) = Value::try_from(&dif.scheduler) {
            t.insert("scheduler".into(), v);
        }
        let cubes: Vec<Value> = dif
            .cubes
            .iter()
            .map(|c| {
                let mut q = Table::new();
                q.insert("id".into(), (c.id as i64).into());
                q.insert("name".into(), c.name.clone().into());
                q.insert("reliable".into(), c.reliable.into());
                if c.efcp != rina_core::efcp::EfcpTuning::default() {
                    if let Ok(v) = Value::try_from(&c.efcp) {
                        q.insert("efcp".into(), v);
                    }
                }
                q.insert("urgency".into(), i64::from(c.urgency).into());
                q.insert("cherish".into(), i64::from(c.cherish).into());
                if let Some(b) = c.bandwidth_bps {
                    q.insert("avg_bandwidth_bps".into(), (b as i64).into());
                }
                if let Some(dl) = c.delay {
                    q.insert("delay_us".into(), (dl.as_micros() as i64).into());
                }
                if let Some(ls) = c.loss {
                    q.insert("loss_ppm".into(), ((ls * 1e6) as i64).into());
                }
                // The cube of each lower DIF this cube rides on (seed 003's
                // mapping): one N-1 flow per lower cube in use; only the
                // lower DIFs this member has neighbours over (an HR of
                // seed 003's spn reaches its PE over a link, not over mr).
                let lower: Table = c
                    .maps_to
                    .iter()
                    .filter(|(&l, _)| {
                        dif.adjacencies
                            .iter()
                            .any(|a| (a.a == node || a.b == node) && a.over == Over::Dif(l))
                    })
                    .filter_map(|(&l, &id)| {
                        let ld = &exp.difs[l];
                        let lc = ld.cubes.iter().find(|lc| lc.id == id)?;
                        Some((ld.name.clone(), Value::from(lc.name.clone())))
                    })
                    .collect();
                if !lower.is_empty() {
                    q.insert("lower".into(), Value::Table(lower));
                }
                Value::Table(q)
            })
            .collect();
        if !cubes.is_empty() {
            t.insert("qos_cube".into(), Value::Array(cubes));
        }
        // Neighbours, the one this member enrolls through first.
        let via = dif.enrolls_via.get(&node).copied();
        let mut nbs: Vec<(usize, Over)> = dif
            .adjacencies
            .iter()
            .filter_map(|a| {
                if a.a == node {
                    Some((a.b, a.over))
                } else if a.b == node {
                    Some((a.a, a.over))
                } else {
                    None
                }
            })
            .collect();
        nbs.sort_by_key(|(p, _)| Some(*p) != via);
        let nbs: Vec<Value> = nbs
            .into_iter()
            .map(|(p, over)| {
                let mut n = Table::new();
                n.insert("name".into(), ipcp_name(exp, p, d).into());
                let over = match over {
                    Over::Link(l) => exp.links[l].name.clone(),
                    Over::Dif(x) => exp.difs[x].name.clone(),
                };
                n.insert("over".into(), over.into());
                Value::Table(n)
            })
            .collect();
        if !nbs.is_empty() {
            t.insert("neighbor".into(), Value::Array(nbs));
        }
        ipcps.push(Value::Table(t));
    }
    let mut sys = Table::new();
    sys.insert("name".into(), exp.nodes[node].clone().into());
    sys.insert("socket".into(), socket.display().to_string().into());
    let mut root = Table::new();
    root.insert("system".into(), Value::Table(sys));
    root.insert("ipcp".into(), Value::Array(ipcps));
    format!(
        "# Generated by rina-lab for node `{}` of experiment `{}`.\n{}",
        exp.nodes[node],
        exp.name,
        toml::to_string(&root).unwrap_or_default()
    )
}

/// Hops between `a` and `b` in DIF `dif`'s adjacency graph (BFS).
pub fn hops(exp: &Experiment, dif: usize, a: usize, b: usize) -> Option<u32> {
    let d = &exp.difs[dif];
    let mut dist: BTreeMap<usize, u32> = BTreeMap::new();
    dist.insert(a, 0);
    let mut q = std::collections::VecDeque::from([a]);
    while let Some(x) = q.pop_front() {
        if x == b {
            return dist.get(&x).copied();
        }
        let dx = dist[&x];
        for adj in &d.adjacencies {
            let y = if adj.a == x {
                adj.b
            } else if adj.b == x {
                adj.a
            } else {
                continue;
            };
            if let std::collections::btree_map::Entry::Vacant(e) = dist.entry(y) {
                e.insert(dx + 1);
                q.push_back(y);
            }
        }
    }
    None
}

/// The node a destination is at (at the start).
pub fn dest_node(exp: &Experiment, d: Dest) -> usize {
    exp.dest_node(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every member of a DIF gets the same max PDU size over shim-eth,
    /// also a member whose own adjacencies in it all cross another normal
    /// DIF (seed 003's SPN at pe-0-0 and pe-1-2 over the MR DIF), since
    /// enrollment refuses a member whose wire profile differs.
    #[test]
    fn every_member_of_a_dif_has_the_same_max_pdu_over_shim_eth() {
        let text = include_str!("../../../../../examples/lab/metro-37.toml");
        let exp = crate::resolve::load(text, Some("spn-mr-90")).expect("metro-37 resolves");
        let eth = |l: usize| ShimKind::Eth {
            interface: format!("l{l}"),
            vlan: 10,
            delay_us: 0,
            loss: 0.0,
            seed: 1,
        };
        let mut by_dif: BTreeMap<String, BTreeMap<Option<i64>, Vec<usize>>> = BTreeMap::new();
        for n in 0..exp.nodes.len() {
            let text = node_config(&exp, n, Path::new("/tmp/x.sock"), &eth, &ShimApps::new());
            let cfg: Table = toml::from_str(&text).expect("a generated config parses");
            for ip in cfg["ipcp"].as_array().expect("ipcps") {
                if ip["type"].as_str() == Some("normal") {
                    let dif = ip["dif"].as_str().expect("dif").to_string();
                    let max = ip.get("max_pdu").and_then(|v| v.as_integer());
                    by_dif
                        .entry(dif)
                        .or_default()
                        .entry(max)
                        .or_default()
                        .push(n);
                }
            }
        }
        assert!(
            by_dif.contains_key("spn") && by_dif.contains_key("mr"),
            "{by_dif:?}"
        );
        for (dif, sizes) in &by_dif {
            assert_eq!(sizes.len(), 1, "DIF {dif}: max_pdu by member {sizes:?}");
        }
        // Both have adjacencies over the links; the video DIF, only over
        // other DIFs, keeps the default everywhere.
        for dif in ["spn", "mr"] {
            let sizes = &by_dif[dif];
            assert!(
                sizes.contains_key(&Some(i64::from(ETH_MAX_PDU))),
                "DIF {dif}: {sizes:?}"
            );
        }
    }
}
