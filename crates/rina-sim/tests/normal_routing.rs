//! Simulation tests of dynamic routing in the normal IPCP: unchanged
//! rina-core normal IPCPs running link-state routing (FSOs in CDAP M_WRITEs
//! inside management PDUs), no static route anywhere, links cut while
//! flows run. Deterministic: fixed seeds, virtual time. Figures are printed
//! (`cargo test -- --nocapture`).

mod common;

use common::{at_ms, converged_mesh, ideal, reliable, routed_cfg as cfg, MS};
use rina_core::normal::NormalError;
use rina_core::Instant;
use rina_sim::chain::{Chain, Mesh, RIGHT};
use rina_sim::normal_node::FIRST_ACCEPTED_FLOW;
use rina_sim::{App, LinkConfig, NormalEvent};
use rina_wire::QosSpec;
use std::time::Duration;

fn ms_of(t: Instant) -> f64 {
    t.as_nanos() as f64 / 1e6
}

/// Tags delivered on the first flow node `i` accepted.
fn received(m: &Mesh, i: usize) -> Vec<(Instant, u64)> {
    m.node(i)
        .app(FIRST_ACCEPTED_FLOW)
        .map(|a| a.delivered.iter().map(|d| (d.at, d.tag)).collect())
        .unwrap_or_default()
}

/// The longest time between two deliveries.
fn longest_gap(d: &[(Instant, u64)]) -> Duration {
    d.windows(2)
        .map(|w| w[1].0 - w[0].0)
        .max()
        .unwrap_or_default()
}

#[test]
fn a_line_of_five_converges_and_carries_a_flow_end_to_end() {
    let edges = [(0, 1), (1, 2), (2, 3), (3, 4)];
    let mut m = Mesh::new(1, 5, &edges, ideal(), cfg);
    for i in 0..5 {
        assert!(m.node(i).ipcp().rmt().table().is_empty(), "no static route");
    }
    let t = m.run_until_converged(MS, at_ms(5_000)).expect("converges");
    println!("line of 5: converged at {} ms", ms_of(t));
    // FSOs travel 4 hops of 1 ms; floods of a node leave at most every
    // 100 ms and tables are computed at most every 100 ms.
    assert!(t <= at_ms(500), "converged at {t:?}");
    let hops = m.node(0).ipcp().routing().unwrap().next_hops().clone();
    assert_eq!(hops.keys().copied().collect::<Vec<_>>(), vec![2, 3, 4, 5]);
    assert!(hops.values().all(|p| p == &vec![Mesh::port(1)]));
    // Every node knows both ends of the 4 links.
    assert_eq!(m.node(2).ipcp().routing().unwrap().db_len(), 8);

    m.register(4, "sink", App::sink());
    m.allocate(t, 0, 1, "src", "sink", reliable());
    m.world.run_until(t + MS * 100).unwrap();
    let a = m.node(0).app(1).unwrap();
    assert_eq!(a.allocated_at, Some(t + MS * 8), "4 hops there and back");
    m.stream(t + MS * 100, 0, 1, 500, 1000, MS);
    m.world.run_until(t + MS * 2000).unwrap();
    let got: Vec<u64> = received(&m, 4).iter().map(|d| d.1).collect();
    assert_eq!(got, (0..500).collect::<Vec<_>>());
    // The middle relays data; FSO messages are counted apart.
    let mid = m.node(2).ipcp();
    assert!(mid.counters().relayed >= 500);
    assert_eq!(mid.counters().rx_mgmt_malformed, 0);
    let rc = mid.routing_counters().unwrap();
    println!(
        "line of 5, middle node: {} FSOs received ({} accepted), {} messages sent, {} computations",
        rc.rx_fsos, rc.rx_accepted, rc.tx_messages, rc.computations
    );
}

#[test]
fn a_chain_with_routing_configured_needs_no_static_routes() {
    let mut c = Chain::new(2, 4, ideal(), cfg);
    assert!(c.node(0).ipcp().rmt().table().is_empty());
    c.register(3, "echo", App::echo());
    c.allocate(at_ms(500), 0, 1, "perf", "echo", QosSpec::default());
    c.stream(at_ms(600), 0, 1, 50, 100, MS);
    c.world.run_until(at_ms(1500)).unwrap();
    let back: Vec<u64> = c
        .node(0)
        .app(1)
        .unwrap()
        .delivered
        .iter()
        .map(|d| d.tag)
        .collect();
    assert_eq!(back, (0..50).collect::<Vec<_>>());
    let t: Vec<_> = c
        .node(0)
        .ipcp()
        .rmt()
        .table()
        .entries()
        .map(|e| e.0)
        .collect();
    assert_eq!(t, vec![2, 3, 4]);
    assert!(c
        .node(0)
        .ipcp()
        .rmt()
        .table()
        .entries()
        .all(|e| e.2 == [RIGHT]));
}

/// A square 0-1-2-3-0; a reliable flow from node 0 to node 2 goes by node 1
/// (equal costs: the lowest neighbour address wins) until link 1-2 is cut.
/// Returns the mesh, the cut time and the reroute time (node 0's next hop
/// to node 2 moved to node 3).
fn square_with_cut(seed: u64, link: LinkConfig, count: u64) -> (Mesh, Instant, Instant) {
    let edges = [(0, 1), (1, 2), (2, 3), (3, 0)];
    let (mut m, t0) = converged_mesh(seed, 4, &edges, link, cfg);
    let via = |m: &Mesh| {
        m.node(0)
            .ipcp()
            .routing()
            .unwrap()
            .next_hops()
            .get(&3)
            .cloned()
    };
    assert_eq!(via(&m), Some(vec![Mesh::port(1)]));
    m.register(2, "sink", App::sink());
    m.allocate(t0, 0, 1, "src", "sink", reliable());
    let start = t0 + MS * 100;
    m.stream(start, 0, 1, count, 1000, MS);
    let cut = start + MS * 500;
    m.cut(cut, 1, 2);
    m.world.run_until(cut).unwrap();
    let mut rerouted = None;
    while m.world.now() < cut + MS * 5_000 {
        let next = m.world.now() + MS;
        m.world.run_until(next).unwrap();
        if rerouted.is_none() && via(&m) == Some(vec![Mesh::port(3)]) {
            rerouted = Some(m.world.now());
        }
    }
    let rerouted = rerouted.expect("node 0 reroutes by node 3");
    (m, cut, rerouted)
}

#[test]
fn cutting_a_link_on_the_path_reroutes_and_a_reliable_flow_loses_nothing() {
    let (mut m, cut, rerouted) = square_with_cut(3, ideal(), 2000);
    m.world.run_until(cut + MS * 10_000).unwrap();
    let d = received(&m, 2);
    let tags: Vec<u64> = d.iter().map(|x| x.1).collect();
    assert_eq!(tags, (0..2000).collect::<Vec<_>>(), "everything, in order");
    let outage = longest_gap(&d);
    println!(
        "square, link 1-2 cut at {} ms: node 0 rerouted after {} ms; \
         longest delivery gap {} ms; last SDU at {} ms",
        ms_of(cut),
        ms_of(rerouted) - ms_of(cut),
        outage.as_secs_f64() * 1e3,
        ms_of(d.last().unwrap().0)
    );
    assert!(rerouted - cut <= Duration::from_millis(300));
    assert!(outage < Duration::from_secs(2), "outage {outage:?}");
    let s = m.node(0).app(1).unwrap();
    assert!(!s.failed);
    // The link is gone from every database as a live link.
    for i in 0..4 {
        let ls = m.node(i).ipcp().routing().unwrap();
        let f = ls.fso(m.world.now(), 2, 3);
        assert!(f.is_some_and(|f| !f.up), "node {i}: {f:?}");
    }
}

#[test]
fn a_node_cut_off_becomes_unreachable_and_flows_to_it_fail() {
    // Line 0-1-2; node 2's only link is cut while a reliable flow runs.
    let edges = [(0, 1), (1, 2)];
    let (mut m, t0) = converged_mesh(5, 3, &edges, ideal(), cfg);
    m.register(2, "sink", App::sink());
    m.allocate(t0, 0, 1, "src", "sink", reliable());
    m.stream(t0 + MS * 100, 0, 1, 100_000, 100, MS * 10);
    let cut = t0 + MS * 1000;
    m.cut(cut, 1, 2);
    m.world.run_until(cut).unwrap();
    let after = m.run_until_converged(MS, cut + MS * 5_000).unwrap();
    assert!(after > cut);
    println!(
        "node 2 cut off at {} ms; routes converged at {} ms",
        ms_of(cut),
        ms_of(after)
    );
    assert!(!m
        .node(0)
        .ipcp()
        .routing()
        .unwrap()
        .next_hops()
        .contains_key(&3));
    assert!(m.node(0).ipcp().rmt().table().entries().all(|e| e.0 != 3));
    // A new allocation times out (no route for its requests).
    m.allocate(after, 0, 2, "src", "sink", reliable());
    // The running flow exhausts its retransmissions.
    let limit = cut + Duration::from_secs(900);
    while m.world.now() < limit && !m.node(0).app(1).unwrap().failed {
        let next = m.world.now() + Duration::from_secs(1);
        m.world.run_until(next).unwrap();
    }
    let failed_at = m
        .world
        .node_events()
        .find(|(_, n, e)| *n == m.nodes[0] && matches!(e, NormalEvent::Failed { flow: 1 }))
        .map(|(t, _, _)| t)
        .expect("the flow to the lost node fails");
    println!(
        "reliable flow to the lost node failed {} s after the cut",
        (failed_at - cut).as_secs_f64()
    );
    assert_eq!(
        m.node(0).app(2).unwrap().alloc_failed,
        Some((
            after + Duration::from_secs(3),
            NormalError::Timeout {
                dst: 3,
                after: Duration::from_secs(3)
            }
        ))
    );
    assert!(m.node(0).ipcp().counters().tx_dropped > 0);
}

#[test]
fn routing_runs_are_deterministic_for_a_seed() {
    let lossy = || {
        LinkConfig::new(100_000_000, MS)
            .jitter(MS / 2)
            .loss(0.02)
            .queue(10_000)
    };
    let run = |seed| {
        let (mut m, cut, rerouted) = square_with_cut(seed, lossy(), 1000);
        m.world.run_until(cut + MS * 20_000).unwrap();
        let d = received(&m, 2);
        let tags: Vec<u64> = d.iter().map(|x| x.1).collect();
        assert_eq!(tags, (0..1000).collect::<Vec<_>>(), "seed {seed}");
        (m.world.trace_digest(), rerouted - cut, longest_gap(&d))
    };
    let a = run(11);
    let b = run(11);
    let c = run(12);
    println!(
        "2% loss, seed 11: reroute {:?}, longest gap {:?}; seed 12: reroute {:?}, longest gap {:?}",
        a.1, a.2, c.1, c.2
    );
    assert_eq!(a, b, "same seed, same run");
    assert_ne!(a.0, c.0, "another seed, another run");
}
