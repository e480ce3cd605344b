//! Simulation tests of a normal DIF under churn: members that restart with
//! all their state lost, links that flap, applications that come and go,
//! flow requests racing with failures, a partition that heals. Unchanged
//! rina-core normal IPCPs with link-state routing and the disseminated
//! directory; deterministic (fixed seeds, virtual time, no sleeps).

mod common;

use common::{
    converged_mesh, dynamic_cfg as cfg, ideal, member_cfg, mesh_with_echo, name, MS, SEC,
};
use rina_core::normal::{NormalConfig, NormalError};
use rina_core::Instant;
use rina_sim::chain::Mesh;
use rina_sim::App;
use rina_wire::QosSpec;
use std::collections::BTreeMap;
use std::time::Duration;

/// A ring of `n`: node `i` joined to node `i + 1`, the last to node 0.
fn ring(n: usize) -> Vec<(usize, usize)> {
    (0..n).map(|i| (i, (i + 1) % n)).collect()
}

/// Node `i`'s flow-state database: (origin, neighbour) → (seq, up).
fn fso_db(m: &Mesh, i: usize) -> BTreeMap<(u64, u64), (u32, bool)> {
    let now = m.world.now();
    m.node(i)
        .ipcp()
        .routing()
        .unwrap()
        .fsos(now)
        .map(|f| ((f.origin, f.neighbor), (f.seq, f.up)))
        .collect()
}

/// Whether every node holds the same flow-state database (keys, sequence
/// numbers, up or down) and has nothing left to compute.
fn fsos_agree(m: &Mesh) -> bool {
    let first = fso_db(m, 0);
    (0..m.nodes.len())
        .all(|i| fso_db(m, i) == first && !m.node(i).ipcp().routing().unwrap().is_dirty())
}

/// Runs in steps of 10 ms until `ok` holds or `limit`; returns the time.
fn run_until(m: &mut Mesh, limit: Instant, ok: impl Fn(&Mesh) -> bool) -> Option<Instant> {
    loop {
        if ok(m) {
            return Some(m.world.now());
        }
        if m.world.now() >= limit {
            return None;
        }
        let next = m.world.now() + MS * 10;
        m.world.run_until(next).unwrap();
    }
}

/// The next hop (as a neighbour node index) of node `i` towards node `d`.
fn via(m: &Mesh, i: usize, d: usize) -> Option<usize> {
    let hops = m.node(i).ipcp().routing().unwrap().next_hops();
    hops.get(&(d as u64 + 1))
        .and_then(|p| p.first())
        .map(|p| *p as usize - 1)
}

/// A member that restarts (all state lost) with the same address, its
/// neighbours not told (a fast restart over N-1 flows that stay, as a
/// shim-udp flow does): its new FSOs start again at sequence number 1,
/// below the ones the DIF holds. The DIF must take the restarted member's
/// word (it jumps past its old numbers) and the member must get the
/// database, within a second or so, not after refreshes or the maximum age.
#[test]
fn a_member_restarting_with_the_same_address_is_believed_at_once() {
    let mut m = Mesh::new(1, 5, &ring(5), ideal(), cfg);
    m.register_dynamic(2, "app", App::echo());
    m.run_until_converged(MS, Instant::ZERO + SEC * 5)
        .expect("converges");
    // Two refreshes: the DIF holds node 2's FSOs at sequence number 3.
    m.world.run_until(Instant::ZERO + SEC * 45).unwrap();
    assert_eq!(fso_db(&m, 0)[&(3, 2)], (3, true));
    // Node 2 restarts without its link to node 3 (that end stays down).
    let t = m.world.now();
    m.restart(2, cfg(3), true);
    m.cut(t, 2, 3);
    // It comes back with another application than before.
    m.register_at(t, 2, "app2", App::echo());
    let ok = run_until(&mut m, t + SEC * 2, |m| m.converged() && fsos_agree(m));
    let db = fso_db(&m, 0);
    println!(
        "restart: converged {:?} after; node 0 holds (3,2) {:?}, (3,4) {:?}",
        ok.map(|x| x - t),
        db.get(&(3, 2)),
        db.get(&(3, 4))
    );
    assert!(ok.is_some(), "no convergence within 2 s of the restart");
    // Node 2 says its link to node 3 is down, and everyone believes it.
    for i in 0..5 {
        let db = fso_db(&m, i);
        assert!(!db[&(3, 4)].1, "node {i}: link 2-3 still up: {db:?}");
        assert!(db[&(3, 2)].0 > 3, "node {i}: old (3,2) kept");
    }
    // Routes avoid the dead link: node 1 reaches node 3 through 0 and 4.
    assert_eq!(via(&m, 2, 3), Some(1));
    assert_eq!(via(&m, 3, 2), Some(4));
    // Its new registration is found everywhere, the one it lost nowhere
    // (it withdraws what the DIF remembers of it).
    let t = m.world.now();
    m.world.run_until(t + SEC).unwrap();
    for i in 0..5 {
        let ipcp = m.node(i).ipcp();
        assert_eq!(ipcp.resolve(&name("app2")), Some(3), "node {i}");
        assert_eq!(ipcp.resolve(&name("app")), None, "node {i}");
    }
    m.allocate(t + SEC, 0, 1, "c", "app2", QosSpec::default());
    m.stream(t + SEC + MS * 100, 0, 1, 20, 100, MS);
    m.world.run_until(t + SEC * 3).unwrap();
    let echoed = m.node(0).app(1).unwrap().delivered.len();
    assert_eq!(echoed, 20);
}

/// Node 0 bootstraps the DIF (address 1, the DIF's policies); every other
/// node has only its name and the DIF's password and enrolls.
fn member(i: usize) -> NormalConfig {
    member_cfg(i, "s3cret")
}

fn enrolled(m: &Mesh) -> bool {
    (0..m.nodes.len()).all(|i| m.node(i).ipcp().is_enrolled())
}

fn addr(m: &Mesh, i: usize) -> u64 {
    m.node(i).ipcp().config().address
}

/// Every member resolves `app-i` to node `i`'s address, for each `i`.
fn names_resolve(m: &Mesh) -> bool {
    let n = m.nodes.len();
    (0..n).all(|i| {
        (0..n).all(|j| {
            let a = m.node(i).ipcp().resolve(&name(&format!("app-{j}")));
            a == Some(addr(m, j))
        })
    })
}

/// A ring of five that assembled itself, `app-i` registered at node `i`.
fn enrolled_ring(seed: u64) -> (Mesh, Instant) {
    let mut m = Mesh::enrolling(seed, 5, &ring(5), ideal(), member);
    let t = run_until(&mut m, Instant::ZERO + SEC * 30, enrolled).expect("enrolled");
    for i in 0..5 {
        m.register_at(t, i, &format!("app-{i}"), App::echo());
    }
    let t = run_until(&mut m, t + SEC * 10, |m| {
        m.converged() && fsos_agree(m) && names_resolve(m)
    })
    .expect("converges");
    (m, t)
}

/// Restarts node `k` of an enrolled DIF at `at` (all state lost, its
/// neighbours not told), lets it enroll again and register `app-k`, and
/// checks that the DIF converges and carries a flow to it from node `from`.
/// Returns how long after the restart everything converged.
fn restart_and_check(m: &mut Mesh, k: usize, from: usize, at: Instant, flow: u32) -> Duration {
    m.world.run_until(at).unwrap();
    let old = addr(m, k);
    m.restart(k, member(k), false);
    let t = run_until(m, at + SEC * 30, enrolled).expect("enrolled again");
    m.register_at(t, k, &format!("app-{k}"), App::echo());
    let done = run_until(m, t + SEC * 10, |m| {
        m.converged() && fsos_agree(m) && names_resolve(m)
    });
    println!(
        "node {k} restarted at {:?}: enrolled again after {:?} with address {} (was {old}); converged after {:?}",
        at,
        t - at,
        addr(m, k),
        done.map(|d| d - at)
    );
    let done = done.expect("the DIF converges after the restart");
    let target = format!("app-{k}");
    m.allocate(
        done,
        from,
        flow,
        &format!("app-{from}"),
        &target,
        QosSpec::default(),
    );
    m.stream(done + MS * 200, from, flow, 10, 100, MS);
    m.world.run_until(done + SEC).unwrap();
    let app = m.node(from).app(flow).unwrap();
    assert!(app.alloc_failed.is_none(), "{:?}", app.alloc_failed);
    assert_eq!(app.delivered.len(), 10, "echoes from the restarted member");
    done - at
}

/// Members restart (all state lost) and enroll again with the same name:
/// an ordinary member (it enrolls anew and asks for its address again) and
/// the bootstrap member (same configured address), each before its
/// neighbours noticed it was gone. Routing, flooded databases and the
/// directory converge and a flow reaches the restarted member.
#[test]
fn members_restarting_and_enrolling_again_are_reached() {
    let (mut m, t) = enrolled_ring(3);
    let a = restart_and_check(&mut m, 2, 0, t + SEC * 30, 1);
    let t = m.world.now();
    let b = restart_and_check(&mut m, 0, 3, t + SEC * 30, 2);
    assert!(a < SEC * 15 && b < SEC * 15, "{a:?} {b:?}");
}

/// Every node's next hops.
fn all_next_hops(m: &Mesh) -> Vec<BTreeMap<u64, Vec<u32>>> {
    (0..m.nodes.len())
        .map(|i| m.node(i).ipcp().routing().unwrap().next_hops().clone())
        .collect()
}

/// A link that flaps (cut at both ends and back, 25 times, 5 to 60 ms
/// apart) and then stays up: routing converges within a second of the last
/// flap, to exactly the next hops of a ring that never flapped, with one
/// FSO per link end everywhere, no flooding left over, and data crosses the
/// link again.
#[test]
fn a_flapping_link_leaves_the_same_routes_as_no_flapping() {
    let edges = ring(6);
    let (calm, _) = converged_mesh(5, 6, &edges, ideal(), cfg);
    let (mut m, t0) = converged_mesh(5, 6, &edges, ideal(), cfg);
    let mut t = t0 + MS * 100;
    let mut step = 5u32;
    for _ in 0..25 {
        m.cut(t, 0, 1);
        t = t + MS * step;
        m.reconnect(t, 0, 1, true);
        t = t + MS * (65 - step);
        step = (step * 7) % 60 + 1;
    }
    let last = t;
    m.world.run_until(last).unwrap();
    let done = run_until(&mut m, last + SEC * 5, |m| m.converged() && fsos_agree(m))
        .expect("converges after the flapping");
    println!("flapping: converged {:?} after the last flap", done - last);
    assert!(done - last < SEC, "{:?}", done - last);
    assert_eq!(all_next_hops(&m), all_next_hops(&calm));
    for i in 0..6 {
        assert_eq!(m.node(i).ipcp().routing().unwrap().db_len(), 12, "node {i}");
        assert_eq!(m.node(i).ipcp().rmt().table().len(), 5, "node {i}");
    }
    // Quiet once converged: nothing but what refreshes would send.
    let sent = |m: &Mesh| -> u64 {
        (0..6)
            .map(|i| m.node(i).ipcp().routing_counters().unwrap().tx_messages)
            .sum()
    };
    // (the last relays leave within a propagation delay).
    m.world.run_until(done + MS * 500).unwrap();
    let before = sent(&m);
    m.world.run_until(done + SEC * 5).unwrap();
    assert_eq!(sent(&m), before, "flooding goes on after convergence");
    // Data crosses the flapped link: 0 -> 1.
    let t = m.world.now();
    m.register_dynamic(1, "sink", App::sink());
    m.world.run_until(t + SEC).unwrap();
    m.allocate(t + SEC, 0, 1, "src", "sink", QosSpec::default());
    m.stream(t + SEC + MS * 100, 0, 1, 50, 100, MS);
    m.world.run_until(t + SEC * 2).unwrap();
    let got = m
        .node(1)
        .app(rina_sim::normal_node::FIRST_ACCEPTED_FLOW)
        .map_or(0, |a| a.delivered.len());
    assert_eq!(got, 50);
}

/// An application registers, unregisters, registers again and moves, at
/// several members, faster than the directory floods; another comes and
/// goes for good. Once the churn stops every member resolves the first
/// where it ended up and the second nowhere, and after the maximum age
/// only the live registrations are left in the databases.
#[test]
fn directory_churn_converges_and_withdrawals_age_out() {
    let (mut m, t0) = converged_mesh(9, 5, &ring(5), ideal(), cfg);
    let at = |ms: u32| t0 + MS * ms;
    // "x": 1, then 3, then 1 again and 4 for a moment; ends at 1.
    m.register_at(at(0), 1, "x", App::echo());
    m.unregister_at(at(30), 1, "x");
    m.register_at(at(35), 3, "x", App::echo());
    m.unregister_at(at(70), 3, "x");
    m.register_at(at(90), 1, "x", App::echo());
    m.register_at(at(95), 4, "x", App::echo());
    m.unregister_at(at(150), 4, "x");
    m.unregister_at(at(400), 1, "x");
    m.register_at(at(420), 1, "x", App::echo());
    // "y": comes and goes at three members, ends nowhere.
    for (k, node) in [2usize, 0, 3].into_iter().enumerate() {
        let k = k as u32;
        m.register_at(at(10 + 60 * k), node, "y", App::echo());
        m.unregister_at(at(40 + 60 * k), node, "y");
    }
    let last = at(420);
    m.world.run_until(last).unwrap();
    let ok = |m: &Mesh| {
        (0..5).all(|i| {
            let p = m.node(i).ipcp();
            p.resolve(&name("x")) == Some(2) && p.resolve(&name("y")).is_none()
        })
    };
    let done = run_until(&mut m, last + SEC * 5, ok).expect("the directory converges");
    println!(
        "directory churn: converged {:?} after the last change",
        done - last
    );
    assert!(done - last < SEC, "{:?}", done - last);
    m.allocate(done, 2, 1, "c", "x", QosSpec::default());
    m.stream(done + MS * 100, 2, 1, 10, 100, MS);
    m.world.run_until(done + SEC).unwrap();
    assert_eq!(m.node(2).app(1).unwrap().delivered.len(), 10);
    // After the maximum age only x at node 1 is left, everywhere.
    m.world.run_until(done + SEC * 70).unwrap();
    for i in 0..5 {
        let d = m.node(i).ipcp().dynamic_directory().unwrap();
        assert_eq!(d.db_len(), 1, "node {i}");
        assert!(ok(&m));
    }
}

/// A line 0 - 1 - 2 - 3 with `app` at node 3 (accepting).
fn line_with_app(seed: u64) -> (Mesh, Instant) {
    mesh_with_echo(seed, 4, &[(0, 1), (1, 2), (2, 3)], ideal(), cfg, 3, "app")
}

/// Flow requests racing with failures are answered and leave nothing
/// behind: the request in flight when the last link to the destination is
/// cut times out (3 s) at the requester; a flow accepted by a member that
/// restarts while the answer is on its way is allocated, its data finds no
/// one, and it ends at once (the restarted member tells the requester it
/// has no end of that connection); a request that reaches the restarted
/// member before its application registered again is refused at once.
/// Nobody keeps a pending request.
#[test]
fn flow_requests_racing_with_failures_are_answered() {
    // The link 2-3 is cut 1 ms after the request leaves (it is on link 0-1).
    let (mut m, t) = line_with_app(21);
    m.allocate(t, 0, 1, "c", "app", QosSpec::default());
    m.cut(t + MS, 2, 3);
    m.world.run_until(t + SEC * 4).unwrap();
    let a = m.node(0).app(1).unwrap();
    println!("cut under the request: {:?}", a.alloc_failed);
    assert!(matches!(
        a.alloc_failed,
        Some((at, NormalError::Timeout { .. })) if at == t + SEC * 3
    ));
    assert!(!m.node(0).ipcp().is_allocating(1));
    for i in 0..4 {
        assert_eq!(m.node(i).ipcp().pending_requests(), 0, "node {i}");
    }

    // Node 3 restarts 4 ms after the request left: it accepted (3 hops, at
    // 3 ms), the answer is on its way; data then reaches a member that
    // knows nothing of the flow.
    let (mut m, t) = line_with_app(22);
    let reliable = QosSpec {
        reliable: true,
        ..QosSpec::default()
    };
    m.allocate(t, 0, 1, "c", "app", reliable);
    m.stream(t + MS * 100, 0, 1, 1_000_000, 100, MS * 10);
    m.world.run_until(t + MS * 4).unwrap();
    assert_eq!(m.node(3).accepted_flows().len(), 1);
    // (Its new CEP-ids start elsewhere, as with rinad: see
    // `old_pdus_never_land_in_a_flow_of_a_restarted_member`.)
    m.restart(3, cfg(4), true);
    // A second request reaches the restarted member before its
    // application registers again (at 500 ms).
    m.allocate(t + MS * 100, 0, 2, "c", "app", QosSpec::default());
    m.register_at(t + MS * 500, 3, "app", App::echo());
    let limit = t + SEC * 900;
    let ended = |m: &Mesh| {
        let a = m.node(0).app(1).unwrap();
        a.failed || a.deallocated_at.is_some()
    };
    while m.world.now() < limit && !ended(&m) {
        let next = m.world.now() + MS * 100;
        m.world.run_until(next).unwrap();
    }
    let a = m.node(0).app(1).unwrap();
    println!(
        "restart after accepting: allocated at {:?}, failed {}, deallocated at {:?}; second request {:?}",
        a.allocated_at.map(|x| x - t),
        a.failed,
        a.deallocated_at.map(|x| x - t),
        m.node(0).app(2).unwrap().alloc_failed
    );
    assert!(a.allocated_at.is_some());
    // The restarted member answers the flow's PDUs with a DEALLOC of the
    // requester's flow object (it has no end of that connection), once it
    // has a route back (about a second after its restart): the flow ends
    // then, not when its retransmissions give up (364 s before).
    assert!(
        a.deallocated_at.is_some_and(|at| at < t + SEC * 2),
        "the reliable flow to the restarted member did not end within 2 s: {:?}, failed {}",
        a.deallocated_at.map(|x| x - t),
        a.failed
    );
    assert!(m.node(3).ipcp().counters().connections_gone >= 1);
    let second = &m.node(0).app(2).unwrap().alloc_failed;
    assert!(
        matches!(second, Some((at, _)) if *at < t + SEC),
        "{second:?}"
    );
    for i in 0..4 {
        assert_eq!(m.node(i).ipcp().pending_requests(), 0, "node {i}");
    }
}

/// A ring of six split in two halves ({1, 2, 3} and {4, 5, 0}) for
/// `apart`, during which an application moves from one half to the other
/// and a link inside a half goes down; after the heal both halves agree on
/// every flow-state object and name within two seconds, the routes are
/// those of the healed ring, and a flow crosses the old border.
fn partition_and_heal(apart: Duration) {
    let edges = ring(6);
    let (mut m, split) = mesh_with_echo(13, 6, &edges, ideal(), cfg, 2, "p");
    m.cut(split, 0, 1);
    m.cut(split, 3, 4);
    // "p" moves from node 2 to node 5, across the partition.
    m.unregister_at(split + SEC, 2, "p");
    m.register_at(split + SEC * 2, 5, "p", App::echo());
    // Inside the {4, 5, 0} half, link 4-5 goes down for good.
    m.cut(split + SEC * 3, 4, 5);
    let heal = split + apart;
    m.reconnect(heal, 0, 1, true);
    m.reconnect(heal, 3, 4, true);
    m.world.run_until(heal).unwrap();
    let ok = |m: &Mesh| {
        m.converged()
            && fsos_agree(m)
            && (0..6).all(|i| m.node(i).ipcp().resolve(&name("p")) == Some(6))
    };
    let done = run_until(&mut m, heal + SEC * 5, ok);
    println!(
        "partition of {apart:?}: healed at {heal:?}, converged {:?} later",
        done.map(|d| d - heal)
    );
    let done = done.expect("both halves converge after the heal");
    assert!(done - heal < SEC * 2);
    // The line 4 - 3 - 2 - 1 - 0 - 5: node 4 reaches node 5 the long way.
    assert_eq!(via(&m, 4, 5), Some(3));
    assert_eq!(via(&m, 5, 4), Some(0));
    m.allocate(done, 3, 1, "c", "p", QosSpec::default());
    m.stream(done + MS * 100, 3, 1, 10, 100, MS);
    m.world.run_until(done + SEC).unwrap();
    assert_eq!(m.node(3).app(1).unwrap().delivered.len(), 10);
}

#[test]
fn a_short_partition_heals() {
    partition_and_heal(SEC * 5);
}

/// Apart longer than the maximum age: each half forgot the other.
#[test]
fn a_partition_longer_than_the_maximum_age_heals() {
    partition_and_heal(SEC * 90);
}

/// The bootstrap member restarts 2 s after the DIF converged, before any
/// refresh: what it announces again is exactly what the DIF holds (the
/// same sequence numbers), and it must still get the databases.
#[test]
fn the_bootstrap_member_restarting_before_any_refresh_is_reached() {
    let (mut m, t) = enrolled_ring(4);
    let took = restart_and_check(&mut m, 0, 3, t + SEC * 2, 1);
    assert!(took < SEC * 5, "{took:?}");
}

/// A member that restarts (all state lost, its neighbours not told)
/// enrolls again at the first hello it hears, within a hello interval:
/// its neighbours still address their hellos to the address it had, which
/// an IPCP without an address takes as its own (it relays nothing), so it
/// does not wait for them to find the old adjacency dead (3.5 s, and the
/// DIF converged 3.9 s after the restart before).
#[test]
fn a_restarted_member_enrolls_again_within_a_hello_interval() {
    let (mut m, t) = enrolled_ring(3);
    let at = t + SEC * 30;
    m.world.run_until(at).unwrap();
    let old = addr(&m, 2);
    m.restart(2, member(2), false);
    let enrolled_at = run_until(&mut m, at + SEC * 10, enrolled).expect("enrolled again");
    m.register_at(enrolled_at, 2, "app-2", App::echo());
    let converged = run_until(&mut m, at + SEC * 10, |m| {
        m.converged() && fsos_agree(m) && names_resolve(m)
    })
    .expect("converges");
    println!(
        "restart: enrolled again after {:?} (address {}, was {old}), converged after {:?}",
        enrolled_at - at,
        addr(&m, 2),
        converged - at
    );
    assert!(enrolled_at - at <= SEC + MS * 200, "{:?}", enrolled_at - at);
    assert!(converged - at <= SEC * 2, "{:?}", converged - at);
}

/// A member that restarts numbers its CEP-ids from elsewhere (as `rinad`,
/// which draws the first at random; the simulator draws it from the seed
/// and the restart count), so the PDUs a peer still sends on a flow from
/// before never land in a flow of the new instance: they find no flow,
/// the old flow is deallocated, and the new flow to the same application
/// carries only its own SDUs. Before, the new instance numbered from 1
/// again, its first new flow took the old flow's CEP-id, and what the old
/// flow sent went to the new flow's connection (whose EFCP happened to
/// drop it as outside its run), so the old flow was never told it had
/// no far end.
#[test]
fn old_pdus_never_land_in_a_flow_of_a_restarted_member() {
    let (mut m, t) = line_with_app(23);
    m.allocate(t, 0, 1, "c", "app", QosSpec::default());
    m.stream(t + MS * 100, 0, 1, 10, 100, MS * 10);
    m.world.run_until(t + SEC).unwrap();
    assert_eq!(m.node(0).app(1).unwrap().delivered.len(), 10);
    let old_cep: Vec<u64> = m.node(3).ipcp().flows().map(|(_, e)| e.local_cep).collect();
    assert_eq!(old_cep.len(), 1);
    let at = m.world.now();
    m.restart(3, cfg(4), true);
    m.register_at(at, 3, "app", App::echo());
    m.allocate(at + MS * 500, 0, 2, "c", "app", QosSpec::default());
    m.stream(at + MS * 700, 0, 2, 20, 100, MS * 10);
    // Flow 1 speaks again once flow 2 is up.
    m.stream(at + SEC, 0, 1, 10, 100, MS * 10);
    m.world.run_until(at + SEC * 3).unwrap();
    let new_cep: Vec<u64> = m.node(3).ipcp().flows().map(|(_, e)| e.local_cep).collect();
    let one = m.node(0).app(1).unwrap();
    let two = m.node(0).app(2).unwrap();
    println!(
        "CEP-ids at node 3: {old_cep:?} before the restart, {new_cep:?} after; \
         flow 1 deallocated at {:?}; flow 2 echoed {} of 20",
        one.deallocated_at.map(|x| x - at),
        two.delivered.len()
    );
    assert!(!new_cep.contains(&old_cep[0]), "{new_cep:?}");
    assert!(one.deallocated_at.is_some(), "the old flow did not end");
    assert_eq!(
        two.delivered.len(),
        20,
        "flow 2 carried another flow's SDUs"
    );
}
