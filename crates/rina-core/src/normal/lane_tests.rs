//! Unit tests of the cube mapping across DIFs: lanes of an N-1 port (one
//! N-1 flow per cube of the DIF below) carry the QoS-ids they are mapped to,
//! own and relayed, with the mapping of seed 003 (Gold and Silver over A1,
//! Sensitive BE over A2, Bronze over B1, BE over B2).

use super::*;
use crate::rmt::{Fifo, LowerCube};

fn ms(n: u64) -> Instant {
    Instant::from_nanos(n * 1_000_000)
}

/// The cubes of seed 003's SPN DIF, ids 1 to 5.
const GOLD: u64 = 1;
const SILVER: u64 = 2;
const SENSITIVE_BE: u64 = 3;
const BRONZE: u64 = 4;
const BE: u64 = 5;

/// The cubes of the MR DIF below, in lane order: A1, A2, B1, B2.
const LOWER: [&str; 4] = ["A1", "A2", "B1", "B2"];

/// Seed 003's mapping: which lower cube (index in [`LOWER`]) carries each
/// upper cube.
fn lower_of(upper: u64) -> usize {
    match upper {
        GOLD | SILVER => 0,
        SENSITIVE_BE => 1,
        BRONZE => 2,
        _ => 3,
    }
}

fn spn_cubes() -> Vec<QosCube> {
    let u = EfcpConfig::unreliable;
    vec![
        QosCube::new(GOLD, "gold", u()).with_cell(0, 0),
        QosCube::new(SILVER, "silver", u()).with_cell(1, 0),
        QosCube::new(SENSITIVE_BE, "sensitive-be", u()).with_cell(1, 1),
        QosCube::new(BRONZE, "bronze", u()).with_cell(2, 0),
        QosCube::new(BE, "be", u()).with_cell(2, 2),
    ]
}

/// Node `addr` with one bundle of four N-1 ports per neighbour: ports
/// `base..base + 4`, the first (A1) the primary, the others lanes carrying
/// the upper cubes seed 003 maps to them.
fn node(addr: u64, bundles: &[(N1Port, u64)]) -> NormalIpcp {
    let mut c = NormalConfig::new("spn", addr);
    c.cubes = spn_cubes();
    let mut p = NormalIpcp::new(c, Box::new(Fifo::new(1000))).unwrap();
    for &(base, neighbor) in bundles {
        p.neighbor_up(ms(0), base, neighbor, 1);
        for (k, name) in LOWER.iter().enumerate() {
            let port = base + k as u32;
            if k > 0 {
                let carries = (GOLD..=BE).filter(|&q| lower_of(q) == k).collect();
                p.add_lane(base, port, carries).unwrap();
            }
            p.set_lower_cube(
                port,
                Some(LowerCube {
                    id: k as u64 + 1,
                    name: (*name).into(),
                }),
            );
        }
    }
    p
}

/// A — R — B: A's ports 10..14 face R's 20..24, R's 30..34 face B's 40..44.
fn line() -> Vec<NormalIpcp> {
    let mut a = node(1, &[(10, 2)]);
    let mut r = node(2, &[(20, 1), (30, 3)]);
    let mut b = node(3, &[(40, 2)]);
    a.rmt_mut().table_mut().set(3, None, vec![10]);
    r.rmt_mut().table_mut().set(3, None, vec![30]);
    r.rmt_mut().table_mut().set(1, None, vec![20]);
    b.rmt_mut().table_mut().set(1, None, vec![40]);
    vec![a, r, b]
}

/// Where a frame written on (node, port) arrives.
fn wire(node: usize, port: N1Port) -> (usize, N1Port) {
    match (node, port / 10) {
        (0, 1) => (1, port + 10),
        (1, 2) => (0, port - 10),
        (1, 3) => (2, port + 10),
        _ => (1, port - 10),
    }
}

/// Carries frames until nothing moves; counts (node, port) of every frame
/// written, with its QoS-id and whether it is management.
fn carry(
    net: &mut [NormalIpcp],
    seen: &mut BTreeMap<(usize, N1Port), Vec<(u64, bool)>>,
) -> Vec<(usize, Action)> {
    let mut out = Vec::new();
    loop {
        let mut moved = false;
        for i in 0..net.len() {
            while let Some(a) = net[i].poll_action() {
                match a {
                    Action::Transmit { port, frame } => {
                        moved = true;
                        let un = Sdup::without_cipher(net[i].config().sdup)
                            .unprotect(&frame)
                            .unwrap();
                        let pdu = pci::Pdu::parse(&net[i].config().dt, &un.pdu).unwrap();
                        seen.entry((i, port))
                            .or_default()
                            .push((pdu.pci.qos_id, pdu.pci.pdu_type == PduType::Mgmt));
                        let (j, in_port) = wire(i, port);
                        net[j].on_frame(ms(1), in_port, &frame);
                    }
                    a => out.push((i, a)),
                }
            }
        }
        if !moved {
            return out;
        }
    }
}

/// Opens one flow per upper cube from A to B (flow id = QoS-id) and writes
/// `n` SDUs on each.
fn traffic(net: &mut [NormalIpcp], n: usize) -> BTreeMap<(usize, N1Port), Vec<(u64, bool)>> {
    for q in GOLD..=BE {
        let ep = |local, remote_addr| Endpoint {
            local_cep: local,
            remote_addr,
            remote_cep: 100 + q,
            qos_id: q,
        };
        let mut a_ep = ep(100 + q, 3);
        a_ep.remote_cep = 200 + q;
        let mut b_ep = ep(200 + q, 1);
        b_ep.remote_cep = 100 + q;
        let u = EfcpConfig::unreliable();
        net[0].open_flow(ms(0), q as u32, a_ep, u.clone()).unwrap();
        net[2].open_flow(ms(0), q as u32, b_ep, u).unwrap();
    }
    let mut seen = BTreeMap::new();
    for k in 0..n {
        for q in GOLD..=BE {
            net[0].write(ms(1), q as u32, &[q as u8, k as u8]).unwrap();
        }
    }
    let out = carry(net, &mut seen);
    let delivered = out
        .iter()
        .filter(|(i, a)| *i == 2 && matches!(a, Action::Deliver { .. }))
        .count();
    assert_eq!(delivered, 5 * n, "every SDU arrives, whatever lane it took");
    seen
}

#[test]
fn each_upper_cube_rides_on_the_lower_cube_seed_003_maps_it_to() {
    let mut net = line();
    let seen = traffic(&mut net, 10);
    // Own PDUs at A (ports 10..14) and relayed ones at R (30..34).
    for (node, base) in [(0, 10), (1, 30)] {
        for (k, cube) in LOWER.iter().enumerate() {
            let port = base + k as u32;
            let mut qos: Vec<u64> = seen[&(node, port)].iter().map(|&(q, _)| q).collect();
            qos.sort_unstable();
            qos.dedup();
            let want: Vec<u64> = (GOLD..=BE).filter(|&q| lower_of(q) == k).collect();
            assert_eq!(qos, want, "node {node}, lower cube {cube} (port {port})");
            assert_eq!(seen[&(node, port)].len(), 10 * want.len());
            assert_eq!(net[node].rmt().port_sent(port), 10 * want.len() as u64);
        }
    }
    // Nothing went the other way but acknowledgements of nothing: these
    // flows are unreliable, so B sends no PDUs at all.
    assert!(!seen.keys().any(|(n, _)| *n == 2));
    let rib = net[0].rib();
    let v = rib.read("/rmt/n1flows/pid=11", 0).unwrap()[0].value.clone();
    let text = format!("{v:?}");
    assert!(
        text.contains("lower cube A2 (id 2)") && text.contains("lane of 10 for QoS-ids 3"),
        "{text}"
    );
    // Only the primary is a neighbour: routing and membership see one link.
    assert_eq!(
        net[1].neighbors().map(|(p, ..)| p).collect::<Vec<_>>(),
        [20, 30]
    );
    assert_eq!(net[0].rmt().primary_ports().collect::<Vec<_>>(), [10]);
}

#[test]
fn management_stays_on_the_primary_and_a_lost_lane_falls_back_to_it() {
    let mut net = line();
    let mut seen = BTreeMap::new();
    net[0].send_management(ms(1), 10, 2, b"hello");
    net[0].send_management_to(ms(1), 3, b"far");
    carry(&mut net, &mut seen);
    assert_eq!(seen[&(0, 10)], [(MGMT_QOS_ID, true), (MGMT_QOS_ID, true)]);
    assert_eq!(
        seen[&(1, 30)],
        [(MGMT_QOS_ID, true)],
        "relayed on the primary"
    );
    assert_eq!(seen.len(), 2);
    // B2 (port 13) goes down at A: BE falls back to the primary there, and
    // still takes B2 at R.
    net[0].remove_port(13);
    let seen = traffic(&mut net, 4);
    let qos = |n, p| -> Vec<u64> { seen[&(n, p)].iter().map(|&(q, _)| q).collect() };
    assert_eq!(qos(0, 10).iter().filter(|&&q| q == BE).count(), 4);
    assert!(!seen.contains_key(&(0, 13)));
    assert_eq!(qos(1, 33), [BE; 4]);
    // A frame that arrives on a lane counts as arriving on its primary.
    assert_eq!(
        net[2].neighbors().map(|(p, ..)| p).collect::<Vec<_>>(),
        [40]
    );
}

#[test]
fn lanes_need_a_primary_that_is_a_port() {
    let mut p = node(1, &[(10, 2)]);
    let e = p.add_lane(99, 100, [1].into()).unwrap_err();
    assert_eq!(e, NormalError::UnknownPort(99));
    // A lane cannot have lanes of its own.
    assert!(p.add_lane(11, 100, [1].into()).is_err());
    // Removing the primary frees its lanes (the driver removes them too).
    p.remove_port(10);
    assert_eq!(p.rmt().lanes().count(), 0);
    assert_eq!(p.rmt().primary_ports().collect::<Vec<_>>(), [11, 12, 13]);
}
