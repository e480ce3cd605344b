//! Simulation tests of a normal DIF under churn: members that restart with
//! all their state lost, links that flap, applications that come and go,
//! flow requests racing with failures, a partition that heals. Unchanged
//! rina-core normal IPCPs with link-state routing and the disseminated
//! directory; deterministic (fixed seeds, virtual time, no sleeps).

use rina_core::normal::{MembershipConfig, NormalConfig};
use rina_core::sdup::SdupConfig;
use rina_core::{directory, routing, Instant};
use rina_sim::chain::Mesh;
use rina_sim::{App, LinkConfig};
use rina_wire::{AppName, QosSpec};
use std::collections::BTreeMap;
use std::time::Duration;

const MS: Duration = Duration::from_millis(1);
const SEC: Duration = Duration::from_secs(1);

fn cfg(addr: u64) -> NormalConfig {
    let mut c = NormalConfig::new("net", addr);
    c.dt.max_pdu_size = 1400;
    c.sdup = SdupConfig {
        ttl: Some(64),
        crc: true,
    };
    c.routing = Some(routing::Config::default());
    c.dynamic_directory = Some(directory::Config::default());
    c
}

fn ideal() -> LinkConfig {
    LinkConfig::ideal(MS).queue(10_000)
}

fn name(s: &str) -> AppName {
    s.parse().unwrap()
}

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
    let mut c = cfg(if i == 0 { 1 } else { 0 });
    if i != 0 {
        c.routing = None;
        c.dynamic_directory = None;
    }
    let mut ms = MembershipConfig::new(format!("ipcp-{i}").parse().unwrap());
    ms.password = Some("s3cret".into());
    c.membership = Some(ms);
    c
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
