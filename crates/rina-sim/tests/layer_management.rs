//! Simulation tests of the normal DIF's layer management over CDAP: a
//! member reads a neighbour's RIB (`M_READ` / `M_READ_R`), under the DIF's
//! access policy and with lost messages; and many members enrolling at the
//! same instant through several enrollers get distinct addresses.
//! Deterministic: fixed seeds, virtual time.

mod common;

use common::{at_ms, ideal, member_cfg, MS};
use rina_core::normal::{NormalConfig, RibReadError, CDAP_DISCRIMINATOR, REMOTE_OWNER};
use rina_core::sdup::Sdup;
use rina_core::{directory, routing, Instant};
use rina_sim::chain::Mesh;
use rina_sim::normal_node::{NormalCommand, NormalEvent};
use rina_sim::LinkConfig;
use rina_wire::cdap::{CdapMessage, OpCode};
use rina_wire::ctl::RibObjectInfo;
use rina_wire::pci;
use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

/// Node 0 bootstraps the DIF (address 1); the others enroll.
fn config(i: usize) -> NormalConfig {
    member_cfg(i, "s3cret")
}

/// The CDAP operation of a frame's management payload, if it has one.
fn cdap_op(frame: &[u8]) -> Option<OpCode> {
    let c = config(0);
    let un = Sdup::without_cipher(c.sdup).unprotect(frame).ok()?;
    let pdu = pci::Pdu::parse(&c.dt, &un.pdu).ok()?;
    let pci::Body::Data(payload) = pdu.body else {
        return None;
    };
    if pdu.pci.pdu_type != pci::PduType::Mgmt || payload.first() != Some(&CDAP_DISCRIMINATOR) {
        return None;
    }
    Some(CdapMessage::decode(&payload[1..]).ok()?.op_code())
}

/// Three members in a line, 0 – 1 – 2, enrolled by 3 s; `cfg` may change
/// each one's configuration.
fn line(seed: u64, cfg: impl Fn(usize, &mut NormalConfig)) -> Mesh {
    let mut m = Mesh::enrolling(seed, 3, &[(0, 1), (1, 2)], ideal(), |i| {
        let mut c = config(i);
        cfg(i, &mut c);
        c
    });
    m.world.run_until(at_ms(3000)).unwrap();
    for i in 0..3 {
        assert!(m.node(i).ipcp().is_enrolled(), "node {i} enrolled");
    }
    m
}

/// How a read of a neighbour's RIB ended: the IPCP's outcome, or the
/// error that kept it from starting.
type ReadEnd = Result<Result<Vec<RibObjectInfo>, RibReadError>, String>;

/// Node `from` reads `path` of neighbour `neighbor` at `at`; returns the
/// outcome and when it came, after running to `at + 10 s`.
fn read(
    m: &mut Mesh,
    at: Instant,
    from: usize,
    neighbor: &str,
    path: &str,
) -> Option<(Instant, Result<Vec<RibObjectInfo>, RibReadError>)> {
    match read_or_not(m, at, from, neighbor, path)? {
        (t, Ok(r)) => Some((t, r)),
        (_, Err(e)) => panic!("the read did not start: {e}"),
    }
}

/// [`read`], which may fail to start.
fn read_or_not(
    m: &mut Mesh,
    at: Instant,
    from: usize,
    neighbor: &str,
    path: &str,
) -> Option<(Instant, ReadEnd)> {
    let node = m.nodes[from];
    m.world.schedule(
        at,
        node,
        NormalCommand::ReadRib {
            neighbor: neighbor.into(),
            path: path.into(),
            depth: None,
        },
    );
    m.world.run_until(at + Duration::from_secs(10)).unwrap();
    m.world
        .node_events()
        .filter(|(t, n, _)| *n == node && *t >= at)
        .find_map(|(t, _, e)| match e {
            NormalEvent::RibRead { result, .. } => Some((t, Ok(result.clone()))),
            NormalEvent::ReadRibFailed(e) => Some((t, Err(e.to_string()))),
            _ => None,
        })
}

#[test]
fn a_member_reads_a_neighbours_rib_subtree() {
    let mut m = line(31, |_, _| {});
    let addr1 = m.node(1).ipcp().config().address;
    let (t, r) = read(&mut m, at_ms(3000), 2, "ipcp-1", "/difm").unwrap();
    assert_eq!(t, at_ms(3002), "one round trip over a 1 ms link");
    let objs = r.unwrap();
    let a = objs.iter().find(|o| o.name == "/difm/nam/addr").unwrap();
    assert_eq!(a.value, addr1.to_string());
    assert_eq!(a.owner, REMOTE_OWNER);
    // Exactly the subtree, as the neighbour itself lists it.
    let local = m
        .node(1)
        .ipcp()
        .rib()
        .snapshot("/difm", usize::MAX)
        .unwrap();
    let names: Vec<&str> = objs.iter().map(|o| o.name.as_str()).collect();
    let want: Vec<&str> = local.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, want);
    // By address too; the whole RIB is large enough to be fragmented.
    let (_, r) = read(&mut m, at_ms(14_000), 2, &addr1.to_string(), "/").unwrap();
    let all = r.unwrap();
    assert!(
        all.iter().any(|o| o.name.starts_with("/ra/fsos/")),
        "{all:?}"
    );
    eprintln!("remote read of a whole RIB: {} objects", all.len());
    assert_eq!(m.node(1).ipcp().counters().rib_reads_answered, 2);
}

#[test]
fn the_dif_access_policy_and_missing_objects_refuse_with_a_reason() {
    let mut m = line(32, |i, c| {
        if i == 1 {
            c.rib_readable = vec!["/ra".into()];
        }
    });
    let (_, r) = read(&mut m, at_ms(3000), 2, "ipcp-1", "/difm").unwrap();
    assert_eq!(
        r,
        Err(RibReadError::Refused(
            "/difm is not readable by members of net".into()
        ))
    );
    let (_, r) = read(&mut m, at_ms(14_000), 2, "ipcp-1", "/ra/nothing").unwrap();
    assert!(r.unwrap_err().to_string().contains("/ra/nothing"));
    let (_, r) = read_or_not(&mut m, at_ms(25_000), 2, "ipcp-0", "/").unwrap();
    assert_eq!(
        r,
        Err("no neighbour ipcp-0".into()),
        "not a neighbour of node 2"
    );
}

/// Loses the first `n` frames carrying CDAP operation `op`.
fn lose_first(m: &mut Mesh, op: OpCode, n: u32) -> Rc<Cell<u32>> {
    let lost = Rc::new(Cell::new(0));
    let l = lost.clone();
    m.world
        .set_loss_filter(Some(Box::new(move |_, _, frame: &[u8]| {
            if cdap_op(frame) == Some(op) && l.get() < n {
                l.set(l.get() + 1);
                return true;
            }
            false
        })));
    lost
}

#[test]
fn a_lost_read_or_answer_is_asked_again_and_silence_fails_after_3_s() {
    for op in [OpCode::Read, OpCode::ReadR] {
        let mut m = line(33, |_, _| {});
        let lost = lose_first(&mut m, op, 1);
        let (t, r) = read(&mut m, at_ms(3000), 2, "ipcp-1", "/difm/nam").unwrap();
        assert_eq!(lost.get(), 1);
        assert_eq!(t, at_ms(4002), "{op:?}: asked again after 1 s");
        assert_eq!(r.unwrap().len(), 2, "{op:?}: /difm/nam and its address");
    }
    let mut m = line(34, |_, _| {});
    lose_first(&mut m, OpCode::ReadR, u32::MAX);
    let (t, r) = read(&mut m, at_ms(3000), 2, "ipcp-1", "/").unwrap();
    assert_eq!(t, at_ms(6000));
    assert!(matches!(r, Err(RibReadError::Timeout { .. })), "{r:?}");
}

#[test]
fn a_dif_at_work_sends_its_management_through_the_rib_daemons_without_a_refusal() {
    let mut m = line(36, |_, _| {});
    m.register_at(at_ms(3000), 2, "srv", rina_sim::App::echo());
    let _ = read(&mut m, at_ms(3000), 0, "ipcp-1", "/ra");
    for i in 0..3 {
        let p = m.node(i).ipcp();
        let c = p.counters_map();
        for k in [
            "rib_daemon_refused_not_allowed",
            "rib_daemon_refused_no_owner",
            "rib_daemon_refused_bad_name",
            "rib_daemon_rx_unmatched",
            "rx_mgmt_malformed",
        ] {
            assert_eq!(c[k], 0, "node {i}: {k}");
        }
        // Routing and the directory flooded through a session with every
        // neighbour, and nothing waits for an answer any more.
        let neighbours = p.neighbors().count();
        let sessions: Vec<_> = p
            .rib_daemon()
            .sessions()
            .filter(|(_, s)| s.counters.rx_requests > 0)
            .collect();
        assert!(sessions.len() >= neighbours, "node {i}: {sessions:?}");
        assert!(sessions.iter().all(|(_, s)| s.outstanding() == 0));
    }
    assert!(m.node(1).ipcp().counters_map()["rib_daemon_dispatched"] > 0);
}

#[test]
fn lost_directory_writes_are_repaired_by_the_next_refresh() {
    let mut m = line(35, |_, _| {});
    // Every M_WRITE (flow-state objects, directory entries) is lost for
    // half a second after 3 s.
    let lost = Rc::new(Cell::new(0u32));
    let l = lost.clone();
    m.world
        .set_loss_filter(Some(Box::new(move |t, _, frame: &[u8]| {
            let write = cdap_op(frame) == Some(OpCode::Write);
            if write && t < at_ms(3500) {
                l.set(l.get() + 1);
            }
            write && t < at_ms(3500)
        })));
    m.register_at(at_ms(3000), 2, "srv", rina_sim::App::echo());
    let srv: rina_wire::AppName = "srv".parse().unwrap();
    m.world.run_until(at_ms(13_000)).unwrap();
    assert!(lost.get() >= 1, "the registration's flood was lost");
    assert!(!m.node(0).ipcp().knows(&srv), "nothing else brought it");
    // Node 2 re-originates its entry 20 s after the registration.
    m.world.run_until(at_ms(23_100)).unwrap();
    let addr2 = m.node(2).ipcp().config().address;
    assert_eq!(m.node(0).ipcp().resolve(&srv), Some(addr2));
    assert_eq!(m.node(1).ipcp().resolve(&srv), Some(addr2));
    // Every write went through the RIB daemon's sessions with neighbours.
    let sessions = m.node(0).ipcp().rib_daemon().sessions().count();
    assert!(sessions >= 1);
}

/// Four members in a ring (addresses 1–4, static), each the only neighbour
/// of five newcomers that all start at the same instant; every member hands
/// out addresses from 1–28 only (24 members), so that enrollers that cannot know of
/// each other's choices give the same address often.
fn storm(seed: u64) -> (Mesh, Vec<u64>) {
    const ENROLLERS: usize = 4;
    const NEWCOMERS: usize = 20;
    let mut edges = vec![(0, 1), (1, 2), (2, 3), (0, 3)];
    for k in 0..NEWCOMERS {
        edges.push((k % ENROLLERS, ENROLLERS + k));
    }
    let link = LinkConfig::new(100_000_000, MS)
        .jitter(Duration::from_millis(2))
        .queue(10_000);
    let mut m = Mesh::enrolling(seed, ENROLLERS + NEWCOMERS, &edges, link, |i| {
        let mut c = config(i);
        if i < ENROLLERS {
            c.address = i as u64 + 1;
            c.routing = Some(routing::Config::default());
            c.dynamic_directory = Some(directory::Config::default());
        }
        if let Some(mc) = c.membership.as_mut() {
            mc.addresses = (1, 28);
        }
        c
    });
    m.world.set_step_limit(200_000_000);
    m.world.run_until(at_ms(20_000)).unwrap();
    let addrs = (0..ENROLLERS + NEWCOMERS)
        .map(|i| m.node(i).ipcp().config().address)
        .collect();
    (m, addrs)
}

#[test]
fn twenty_members_enrolling_at_once_through_four_enrollers_get_distinct_addresses() {
    let mut renumbered = Vec::new();
    for seed in 0..50 {
        let (m, addrs) = storm(seed);
        let n = addrs.len();
        let distinct: std::collections::BTreeSet<u64> = addrs.iter().copied().collect();
        assert_eq!(distinct.len(), n, "seed {seed}: {addrs:?}");
        assert!(
            !distinct.contains(&0),
            "seed {seed}: all enrolled: {addrs:?}"
        );
        // The DIF works at the final addresses: everyone routes to everyone.
        for i in 0..n {
            let r = m.node(i).ipcp().routing().expect("routing");
            let hops = r.next_hops();
            for a in addrs.iter().filter(|a| **a != addrs[i]) {
                assert!(
                    hops.contains_key(a),
                    "seed {seed}: node {i} has no route to {a}"
                );
            }
        }
        let events = m
            .world
            .node_events()
            .filter(|(_, _, e)| {
                matches!(
                    e,
                    NormalEvent::Membership(rina_core::normal::MembershipEvent::Renumbered { .. })
                )
            })
            .count();
        renumbered.push(events);
    }
    let total: usize = renumbered.iter().sum();
    eprintln!(
        "enrollment storm, 50 seeds: {total} renumberings in all, at most {} in one run; per seed {renumbered:?}",
        renumbered.iter().max().unwrap()
    );
    assert!(total > 0, "the storm does make enrollers collide");
}
