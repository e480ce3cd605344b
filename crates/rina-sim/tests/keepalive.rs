//! Simulation tests of flow keepalive (`rina_core::normal::keepalive`): a
//! flow whose far end restarted ends within about one interval when its
//! cube has keepalive, and never without; an idle flow between live peers
//! stays up (probes are answered); a flow whose peer went silent ends after
//! the misses. Unchanged rina-core normal IPCPs with link-state routing;
//! deterministic (fixed seeds, virtual time, no sleeps).

mod common;

use common::{dynamic_cfg, ideal, mesh_with_echo, MS, SEC};
use rina_core::normal::keepalive::KEEPALIVE_MISSES;
use rina_core::normal::{NormalConfig, QosCube};
use rina_core::Instant;
use rina_sim::chain::Mesh;
use rina_sim::App;
use rina_wire::QosSpec;
use std::time::Duration;

/// A member of DIF `net` at `addr` whose cubes have keepalive `ka`.
fn cfg(addr: u64, ka: Option<Duration>) -> NormalConfig {
    let mut c = dynamic_cfg(addr);
    c.cubes = QosCube::defaults()
        .into_iter()
        .map(|q| QosCube { keepalive: ka, ..q })
        .collect();
    c
}

/// Two members joined by a 1 ms link, `app` (echo) registered at node 1,
/// converged; returns the time.
fn pair(seed: u64, ka: Option<Duration>) -> (Mesh, Instant) {
    pair_with(seed, ka, ka)
}

/// [`pair`] with keepalive `ka0` at node 0 and `ka1` at node 1.
fn pair_with(seed: u64, ka0: Option<Duration>, ka1: Option<Duration>) -> (Mesh, Instant) {
    let cfg = |a| cfg(a, if a == 1 { ka0 } else { ka1 });
    mesh_with_echo(seed, 2, &[(0, 1)], ideal(), cfg, 1, "app")
}

/// Whether flow 1 of node 0 ended (failed or deallocated).
fn ended(m: &Mesh) -> bool {
    m.node(0)
        .app(1)
        .is_some_and(|a| a.failed || a.deallocated_at.is_some())
}

/// Runs in steps of 10 ms until flow 1 of node 0 ended or `limit`; returns
/// when it ended.
fn run_until_ended(m: &mut Mesh, limit: Instant) -> Option<Instant> {
    while m.world.now() < limit {
        if ended(m) {
            return Some(m.world.now());
        }
        let next = m.world.now() + MS * 10;
        m.world.run_until(next).unwrap();
    }
    ended(m).then(|| m.world.now())
}

/// A flow that carries nothing, to a member that restarts (all state
/// lost, its neighbour not told): with keepalive every second the first
/// probe after the restart reaches the new instance, which answers with a
/// DEALLOC, and the flow ends within about an interval; without keepalive
/// nothing ever tells the requester, and the flow stays up.
#[test]
fn a_flow_whose_peer_restarted_ends_within_an_interval_with_keepalive() {
    for reliable in [false, true] {
        let qos = QosSpec {
            reliable,
            ..QosSpec::default()
        };
        let interval = SEC;
        let (mut m, t) = pair(1, Some(interval));
        m.allocate(t, 0, 1, "c", "app", qos);
        m.world.run_until(t + SEC * 5).unwrap();
        assert!(m.node(0).app(1).unwrap().allocated_at.is_some());
        assert!(!ended(&m));
        let restart = m.world.now();
        m.restart(1, cfg(2, Some(interval)), true);
        m.register_at(restart, 1, "app", App::echo());
        let at = run_until_ended(&mut m, restart + SEC * 30);
        println!(
            "keepalive {interval:?}, reliable {reliable}: the flow ended {:?} after the restart",
            at.map(|x| x - restart)
        );
        let took = at.expect("the flow ended") - restart;
        assert!(took <= interval + MS * 200, "{took:?}");
        let a = m.node(0).app(1).unwrap();
        assert!(a.deallocated_at.is_some() && !a.failed);
        assert!(m.node(1).ipcp().counters().connections_gone >= 1);
        assert_eq!(m.node(0).ipcp().counters().keepalive_expired, 0);

        // Without keepalive: up ten minutes later.
        let (mut m, t) = pair(1, None);
        m.allocate(t, 0, 1, "c", "app", qos);
        m.world.run_until(t + SEC * 5).unwrap();
        let restart = m.world.now();
        m.restart(1, cfg(2, None), true);
        m.register_at(restart, 1, "app", App::echo());
        let at = run_until_ended(&mut m, restart + SEC * 600);
        println!("no keepalive, reliable {reliable}: ended {at:?}");
        assert!(at.is_none(), "ended without keepalive at {at:?}");
        assert_eq!(m.node(0).ipcp().counters().keepalives_sent, 0);
    }
}

/// An idle flow between two live members with keepalive stays up: one
/// side probes every interval, the other answers (and, hearing those
/// probes, sends none of its own), and neither ever misses. A flow carrying a one-way
/// stream stays up too (the receiver is heard through the probes'
/// answers, the sender through its data). With keepalive on one side
/// only, the other answers its probes.
#[test]
fn an_idle_flow_between_live_peers_stays_up_with_keepalive() {
    let interval = MS * 500;
    let (mut m, t) = pair(2, Some(interval));
    m.allocate(t, 0, 1, "c", "app", QosSpec::default());
    m.allocate(t, 0, 2, "c", "app", QosSpec::default());
    // Flow 2 carries a stream for 20 s that the echo answers.
    m.stream(t + SEC, 0, 2, 2_000, 100, MS * 10);
    let end = t + SEC * 120;
    m.world.run_until(end).unwrap();
    for flow in [1, 2] {
        let a = m.node(0).app(flow).unwrap();
        assert!(a.allocated_at.is_some(), "flow {flow}");
        assert!(!a.failed && a.deallocated_at.is_none(), "flow {flow} ended");
    }
    assert_eq!(m.node(0).app(2).unwrap().delivered.len(), 2_000);
    let (c0, c1) = (m.node(0).ipcp().counters(), m.node(1).ipcp().counters());
    println!(
        "idle 120 s, keepalive {interval:?}: probes sent {} + {}, answered {} + {}",
        c0.keepalives_sent, c1.keepalives_sent, c0.keepalives_answered, c1.keepalives_answered
    );
    assert_eq!(c0.keepalive_expired + c1.keepalive_expired, 0);
    // About one probe per interval per idle flow (and none while the
    // stream ran both ways), each answered.
    let probes = c0.keepalives_sent + c1.keepalives_sent;
    assert!((300..=600).contains(&probes), "{probes} probes");
    let answered = c0.keepalives_answered + c1.keepalives_answered;
    assert!(probes - answered <= 2, "{answered} of {probes} answered");

    // Keepalive at node 0 only: node 1 answers its probes all the same.
    let (mut m, t) = pair_with(2, Some(interval), None);
    m.allocate(t, 0, 1, "c", "app", QosSpec::default());
    m.world.run_until(t + SEC * 60).unwrap();
    let a = m.node(0).app(1).unwrap();
    assert!(a.allocated_at.is_some() && !a.failed && a.deallocated_at.is_none());
    let (c0, c1) = (m.node(0).ipcp().counters(), m.node(1).ipcp().counters());
    println!(
        "one-sided, 60 s: node 0 sent {} probes, node 1 answered {} and sent {}",
        c0.keepalives_sent, c1.keepalives_answered, c1.keepalives_sent
    );
    assert!(c0.keepalives_sent >= 100 && c1.keepalives_sent == 0);
    assert!(c0.keepalives_sent - c1.keepalives_answered <= 1);
    assert_eq!(c0.keepalive_expired, 0);
}

/// A flow whose peer went silent (the link carries nothing any more, no
/// restart, and nothing else notices: no hellos in this DIF) ends after
/// [`KEEPALIVE_MISSES`] intervals with nothing heard, at both ends; the
/// failure says so and is counted.
#[test]
fn a_silent_peer_ends_the_flow_after_the_misses() {
    let interval = SEC;
    let (mut m, t) = pair(3, Some(interval));
    m.allocate(t, 0, 1, "c", "app", QosSpec::default());
    m.stream(t + SEC, 0, 1, 10, 100, MS * 10);
    let cut = t + SEC * 10;
    m.cut_silently(cut, 0, 1);
    m.world.run_until(cut).unwrap();
    assert_eq!(m.node(0).app(1).unwrap().delivered.len(), 10);
    let at = run_until_ended(&mut m, cut + SEC * 30);
    println!(
        "silent peer, keepalive {interval:?}: the flow ended {:?} after the cut",
        at.map(|x| x - cut)
    );
    let took = at.expect("the flow ended") - cut;
    let misses = KEEPALIVE_MISSES;
    assert!(
        took >= interval * misses && took <= interval * (misses + 1) + MS * 20,
        "{took:?}"
    );
    assert!(m.node(0).app(1).unwrap().failed);
    assert_eq!(m.node(0).ipcp().counters().keepalive_expired, 1);
    // The other end gave up too.
    m.world.run_until(cut + SEC * 6).unwrap();
    assert_eq!(m.node(1).ipcp().counters().keepalive_expired, 1);
    // No keepalive: still up.
    let (mut m, t) = pair(3, None);
    m.allocate(t, 0, 1, "c", "app", QosSpec::default());
    m.cut_silently(t + SEC * 10, 0, 1);
    assert!(run_until_ended(&mut m, t + SEC * 120).is_none());
}

/// Sets the keepalive of cube 1 (unreliable, which `QosSpec::default()`
/// gets) at node `i` to `ka`, as a reload would; returns how many flows
/// up switched.
fn set_keepalive(m: &mut Mesh, i: usize, ka: Option<Duration>) -> usize {
    let now = m.world.now();
    let id = m.nodes[i];
    let n = m
        .node_mut(i)
        .ipcp_mut()
        .set_cube_keepalive(now, 1, ka)
        .expect("a valid interval");
    m.world.rearm(id);
    n
}

/// A cube's keepalive changed on a running IPCP (a configuration read
/// again) applies to its flows up at once: an idle flow probing every
/// second at both ends probes every 100 ms at node 0 after node 0's
/// change, stays up, and, its peer gone silent, ends 3 to 4 of the new
/// intervals later. Turned off at both ends, nothing is probed. A bad
/// interval or an unknown cube is refused and changes nothing.
#[test]
fn a_new_keepalive_interval_applies_to_the_flows_up() {
    let (mut m, t) = pair(4, Some(SEC));
    m.allocate(t, 0, 1, "c", "app", QosSpec::default());
    m.world.run_until(t + SEC * 10).unwrap();
    let sent = |m: &Mesh, i: usize| m.node(i).ipcp().counters().keepalives_sent;
    let before = sent(&m, 0) + sent(&m, 1);
    assert!((5..=12).contains(&before), "{before} probes at 1 s");

    // Node 0 every 100 ms: about 100 probes in 10 s, all from node 0.
    assert_eq!(set_keepalive(&mut m, 0, Some(MS * 100)), 1);
    let (s0, s1) = (sent(&m, 0), sent(&m, 1));
    let t1 = m.world.now();
    m.world.run_until(t1 + SEC * 10).unwrap();
    let (d0, d1) = (sent(&m, 0) - s0, sent(&m, 1) - s1);
    println!("after the change to 100 ms: node 0 sent {d0} probes in 10 s, node 1 {d1}");
    assert!((90..=101).contains(&d0) && d1 <= 1, "{d0} and {d1}");
    assert!(!ended(&m));

    // Refused: nothing changes.
    let now = m.world.now();
    let ipcp = m.node_mut(0).ipcp_mut();
    assert!(ipcp.set_cube_keepalive(now, 1, Some(MS * 5)).is_err());
    assert!(ipcp.set_cube_keepalive(now, 9, Some(SEC)).is_err());
    assert_eq!(ipcp.cube(1).unwrap().keepalive, Some(MS * 100));

    // Off at both ends: no probe any more, the flow stays up.
    set_keepalive(&mut m, 0, None);
    set_keepalive(&mut m, 1, None);
    let (s0, s1) = (sent(&m, 0), sent(&m, 1));
    let t2 = m.world.now();
    m.world.run_until(t2 + SEC * 10).unwrap();
    assert_eq!((sent(&m, 0), sent(&m, 1)), (s0, s1));
    assert!(!ended(&m));

    // On again at node 0 only, then the peer goes silent: the flow ends
    // after the misses of the new interval.
    let interval = MS * 200;
    set_keepalive(&mut m, 0, Some(interval));
    let cut = m.world.now() + SEC * 2;
    m.cut_silently(cut, 0, 1);
    m.world.run_until(cut).unwrap();
    assert!(!ended(&m));
    let took = run_until_ended(&mut m, cut + SEC * 10).expect("the flow ended") - cut;
    println!("switched to {interval:?}, silent peer: ended {took:?} after the cut");
    let misses = KEEPALIVE_MISSES;
    assert!(
        took >= interval * (misses - 1) && took <= interval * (misses + 1) + MS * 20,
        "{took:?}"
    );
    assert_eq!(m.node(0).ipcp().counters().keepalive_expired, 1);
}
