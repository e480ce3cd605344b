//! Simulation tests of the disseminated directory in the normal IPCP:
//! unchanged rina-core normal IPCPs running link-state routing and the
//! flooded directory (entries in CDAP M_WRITEs inside management PDUs), no
//! static route and no static directory entry anywhere. Deterministic:
//! fixed seeds, virtual time.

mod common;

use common::{at_ms, dynamic_cfg as cfg, ideal, name, routed_cfg, MS};
use rina_core::rib::ObjValue;
use rina_sim::chain::Mesh;
use rina_sim::normal_node::FIRST_ACCEPTED_FLOW;
use rina_sim::App;
use rina_wire::QosSpec;

fn line() -> Mesh {
    let edges = [(0, 1), (1, 2), (2, 3)];
    Mesh::new(7, 4, &edges, ideal(), cfg)
}

fn echoed(m: &Mesh, node: usize, flow: u32) -> Vec<u64> {
    m.node(node)
        .app(flow)
        .map(|a| a.delivered.iter().map(|d| d.tag).collect())
        .unwrap_or_default()
}

#[test]
fn a_name_registered_far_away_is_found_without_a_static_directory() {
    let mut m = line();
    m.register_dynamic(3, "echo", App::echo());
    for i in 0..4 {
        assert!(m.node(i).ipcp().config().directory.is_empty());
    }
    assert!(!m.node(0).ipcp().knows(&name("echo")));
    let t = m
        .run_until_converged(MS, at_ms(5_000))
        .expect("routing converges");
    m.world.run_until(t + MS * 500).unwrap();
    for i in 0..3 {
        assert_eq!(m.node(i).ipcp().resolve(&name("echo")), Some(4), "node {i}");
        assert!(m.node(i).ipcp().knows(&name("echo")));
    }
    assert_eq!(m.node(0).ipcp().resolve(&name("nobody")), None);

    m.allocate(at_ms(1000), 0, 1, "perf", "echo", QosSpec::default());
    m.stream(at_ms(1100), 0, 1, 50, 100, MS);
    m.world.run_until(at_ms(2000)).unwrap();
    assert!(m.node(0).app(1).unwrap().allocated_at.is_some());
    assert_eq!(echoed(&m, 0, 1), (0..50).collect::<Vec<_>>());

    // Counters, RIB, nothing malformed.
    for i in 0..4 {
        let c = m.node(i).ipcp().counters_map();
        assert_eq!(c["rx_mgmt_malformed"], 0, "node {i}");
        assert_eq!(c["directory_entries"], 1, "node {i}");
        if i != 3 {
            assert!(c["directory_rx_accepted"] >= 1, "node {i}");
        }
    }
    let rib = m.node(0).ipcp().rib();
    let e = rib
        .get("/difm/nsm/dft/key=echo")
        .expect("dynamic entry in RIB");
    assert_eq!(e.value, ObjValue::Int(4));
}

#[test]
fn an_application_that_moves_is_found_at_its_new_place() {
    let mut m = line();
    m.register_dynamic(3, "echo", App::echo());
    m.allocate(at_ms(1000), 0, 1, "perf", "echo", QosSpec::default());
    m.stream(at_ms(1100), 0, 1, 10, 100, MS);
    m.world.run_until(at_ms(1500)).unwrap();
    assert_eq!(echoed(&m, 0, 1), (0..10).collect::<Vec<_>>());
    assert!(m.node(3).app(FIRST_ACCEPTED_FLOW).is_some());

    // The application moves from node 3 to node 1.
    m.unregister_at(at_ms(2000), 3, "echo");
    m.register_at(at_ms(2000), 1, "echo", App::echo());
    m.world.run_until(at_ms(3000)).unwrap();
    for i in 0..4 {
        assert_eq!(m.node(i).ipcp().resolve(&name("echo")), Some(2), "node {i}");
    }
    m.allocate(at_ms(3000), 0, 2, "perf", "echo", QosSpec::default());
    m.stream(at_ms(3100), 0, 2, 20, 100, MS);
    m.world.run_until(at_ms(4000)).unwrap();
    assert!(m.node(0).app(2).unwrap().allocated_at.is_some());
    assert_eq!(echoed(&m, 0, 2), (0..20).collect::<Vec<_>>());
    let at1 = m.node(1).app(FIRST_ACCEPTED_FLOW).expect("node 1 accepted");
    assert_eq!(at1.delivered.len(), 20);
    let rib = m.node(2).ipcp().rib();
    assert_eq!(
        rib.get("/difm/nsm/dft/key=echo").unwrap().value,
        ObjValue::Int(2)
    );
    for i in 0..4 {
        assert_eq!(m.node(i).ipcp().counters().rx_mgmt_malformed, 0);
    }
}

#[test]
fn without_the_option_nothing_is_flooded_and_names_need_the_static_directory() {
    let mut m = Mesh::new(7, 4, &[(0, 1), (1, 2), (2, 3)], ideal(), routed_cfg);
    m.register_dynamic(3, "echo", App::echo());
    m.world.run_until(at_ms(1000)).unwrap();
    assert_eq!(m.node(0).ipcp().resolve(&name("echo")), None);
    assert!(m.node(0).ipcp().dynamic_directory().is_none());
    assert!(!m
        .node(0)
        .ipcp()
        .counters_map()
        .keys()
        .any(|k| k.starts_with("directory_")));
    m.set_directory("echo", 3);
    m.allocate(at_ms(1000), 0, 1, "perf", "echo", QosSpec::default());
    m.stream(at_ms(1100), 0, 1, 10, 100, MS);
    m.world.run_until(at_ms(2000)).unwrap();
    assert_eq!(echoed(&m, 0, 1), (0..10).collect::<Vec<_>>());
}
