//! Simulation tests of the normal DIF's flow allocator: flows allocated by
//! name (static directory, QoS cubes) across chains of unchanged rina-core
//! normal IPCPs, with flow objects created and deleted by CDAP in management
//! PDUs relayed by the RMT, and the loss of each kind of CDAP message.
//! Deterministic: fixed seeds, virtual time.

mod common;

use common::{at_ms, base_cfg as cfg, ideal, link, name, reliable, tags, MS};
use rina_core::normal::{NormalError, CDAP_DISCRIMINATOR};
use rina_core::sdup::Sdup;
use rina_core::Instant;
use rina_sim::chain::Chain;
use rina_sim::normal_node::FIRST_ACCEPTED_FLOW;
use rina_sim::{App, NormalEvent};
use rina_wire::cdap::{CdapMessage, OpCode};
use rina_wire::fa::FLOW_CLASS;
use rina_wire::pci;
use rina_wire::QosSpec;
use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

#[test]
fn a_flow_allocated_by_name_across_three_nodes_carries_data_both_ways() {
    let mut c = Chain::new(1, 3, ideal(), cfg);
    c.register(2, "echo", App::echo());
    c.allocate(Instant::ZERO, 0, 1, "perf", "echo", QosSpec::default());
    c.world.run_until(at_ms(100)).unwrap();
    let a = c.node(0).app(1).unwrap();
    // Request and acceptance each cross two 1 ms links.
    assert_eq!(a.allocated_at, Some(at_ms(4)), "{a:?}");
    assert_eq!(c.node(2).accepted_flows(), vec![FIRST_ACCEPTED_FLOW]);
    let b = c.node(2).app(FIRST_ACCEPTED_FLOW).unwrap();
    assert_eq!(b.accepted_from, Some(name("perf")));
    assert_eq!(b.allocated_at, Some(at_ms(2)));
    assert_eq!(
        c.node(1).ipcp().counters().relayed,
        2,
        "the middle relayed the request and the response"
    );
    assert_eq!(c.node(1).ipcp().flows().count(), 0);

    c.stream(at_ms(100), 0, 1, 100, 500, MS);
    c.world.run_until(at_ms(1000)).unwrap();
    let there: Vec<u64> = c
        .node(2)
        .app(FIRST_ACCEPTED_FLOW)
        .unwrap()
        .delivered
        .iter()
        .map(|d| d.tag)
        .collect();
    assert_eq!(there, (0..100).collect::<Vec<_>>());
    assert_eq!(tags(&c, 0, 1), (0..100).collect::<Vec<_>>(), "echoed back");
}

#[test]
fn a_refusal_reaches_the_requester_with_its_reason() {
    let mut c = Chain::new(2, 3, ideal(), cfg);
    c.register(2, "busy", App::refuse("come back later"));
    c.allocate(Instant::ZERO, 0, 1, "perf", "busy", QosSpec::default());
    c.world.run_until(at_ms(100)).unwrap();
    let a = c.node(0).app(1).unwrap();
    assert_eq!(
        a.alloc_failed,
        Some((at_ms(4), NormalError::Refused("come back later".into())))
    );
    assert_eq!(a.allocated_at, None);
    assert!(c.node(2).accepted_flows().is_empty());
    assert_eq!(c.node(2).ipcp().counters().alloc_refused, 1);
}

#[test]
fn an_unregistered_name_fails_at_its_ipcp_and_an_unknown_name_fails_at_once() {
    let mut c = Chain::new(3, 3, ideal(), cfg);
    c.set_directory("ghost", 2); // in the directory, registered nowhere
    c.allocate(Instant::ZERO, 0, 1, "perf", "ghost", QosSpec::default());
    c.allocate(Instant::ZERO, 0, 2, "perf", "nobody", QosSpec::default());
    c.world.run_until(at_ms(100)).unwrap();
    assert_eq!(
        c.node(0).app(1).unwrap().alloc_failed,
        Some((
            at_ms(4),
            NormalError::NotRegistered(Box::new(name("ghost")))
        ))
    );
    assert_eq!(
        c.node(0).app(2).unwrap().alloc_failed,
        Some((
            Instant::ZERO,
            NormalError::NameNotFound(Box::new(name("nobody")))
        ))
    );
    assert_eq!(
        c.node(2).ipcp().counters().alloc_requests_in,
        1,
        "only the name in the directory was asked for"
    );
}

#[test]
fn a_reliable_flow_gets_the_reliable_cube_and_survives_5_percent_loss() {
    let mut c = Chain::new(7, 3, link().loss(0.05), cfg);
    c.register(2, "sink", App::sink());
    c.allocate(Instant::ZERO, 0, 1, "perf", "sink", reliable());
    c.world.run_until(at_ms(3000)).unwrap();
    assert!(c.node(0).app(1).unwrap().allocated_at.is_some());
    let (_, ep) = c.node(0).ipcp().flows().next().unwrap();
    assert_eq!(ep.qos_id, 2, "the reliable cube");
    let (_, ep_b) = c.node(2).ipcp().flows().next().unwrap();
    assert_eq!(ep_b.qos_id, 2);
    c.stream(at_ms(3000), 0, 1, 2000, 1000, Duration::ZERO);
    c.world.run_until(at_ms(60_000)).unwrap();
    let got: Vec<u64> = c
        .node(2)
        .app(FIRST_ACCEPTED_FLOW)
        .unwrap()
        .delivered
        .iter()
        .map(|d| d.tag)
        .collect();
    assert_eq!(got, (0..2000).collect::<Vec<_>>(), "complete, in order");
    let st = c.node(0).ipcp().flow_stats(1).unwrap();
    assert!(st.pdus_retransmitted > 0, "{st:?}");
    eprintln!(
        "reliable cube, 5% loss per link, 2 links: 2000 SDUs, {} retransmissions",
        st.pdus_retransmitted
    );
}

#[test]
fn a_request_is_repeated_until_it_gets_through_50_percent_loss() {
    let mut c = Chain::new(9, 2, ideal().loss(0.5), cfg);
    c.register(1, "sink", App::sink());
    c.allocate(Instant::ZERO, 0, 1, "perf", "sink", QosSpec::default());
    c.world.run_until(at_ms(5000)).unwrap();
    let a = c.node(0).app(1).unwrap();
    let at = a.allocated_at.expect("allocated despite the loss");
    let ctr = c.node(0).ipcp().counters();
    assert!(ctr.alloc_retries > 0, "{ctr:?}");
    assert_eq!(c.node(1).accepted_flows().len(), 1, "exactly one flow");
    let requests = c.node(1).ipcp().counters().alloc_requests_in;
    eprintln!(
        "50% loss: allocated at {at:?} after {} repetitions; {} requests reached the responder",
        ctr.alloc_retries, requests
    );
    // Seed 9 always gives this run: 8 requests sent, 6 got through, the
    // first 5 acceptances (sent again for each repetition) were lost.
    assert_eq!(at, at_ms(1752));
    assert_eq!(ctr.alloc_retries, 7);
    assert_eq!(requests, 6);
}

#[test]
fn an_allocation_to_a_dead_peer_times_out_after_exactly_3_s() {
    let mut c = Chain::new(6, 2, link().loss(1.0), cfg);
    c.register(1, "sink", App::sink());
    c.allocate(at_ms(10), 0, 1, "perf", "sink", QosSpec::default());
    c.world.run_until(at_ms(10_000)).unwrap();
    let a = c.node(0).app(1).unwrap();
    assert_eq!(
        a.alloc_failed,
        Some((
            at_ms(3010),
            NormalError::Timeout {
                dst: 2,
                after: Duration::from_secs(3)
            }
        ))
    );
    assert_eq!(c.node(0).ipcp().counters().alloc_retries, 11);
    assert_eq!(c.node(0).ipcp().counters().alloc_timeouts, 1);
    assert!(!c.node(0).ipcp().is_allocating(1));
}

#[test]
fn a_deallocation_reaches_the_peer() {
    let mut c = Chain::new(8, 3, ideal(), cfg);
    c.register(2, "sink", App::sink());
    c.allocate(Instant::ZERO, 0, 1, "perf", "sink", QosSpec::default());
    c.deallocate(at_ms(50), 0, 1);
    c.world.run_until(at_ms(100)).unwrap();
    assert_eq!(c.node(0).app(1).unwrap().deallocated_at, Some(at_ms(50)));
    let b = c.node(2).app(FIRST_ACCEPTED_FLOW).unwrap();
    assert_eq!(b.deallocated_at, Some(at_ms(52)), "two 1 ms links later");
    assert_eq!(c.node(0).ipcp().flows().count(), 0);
    assert_eq!(c.node(2).ipcp().flows().count(), 0);
    assert!(c.world.node_events().any(|(t, n, e)| t == at_ms(52)
        && n == c.nodes[2]
        && *e
            == NormalEvent::Deallocated {
                flow: FIRST_ACCEPTED_FLOW
            }));
}

#[test]
fn a_request_nobody_answers_is_withdrawn_after_the_accept_timeout() {
    // The requester waits longer than the responder's accept timeout, here
    // 5 s (the default is 2 s).
    let mut c = Chain::new(9, 2, ideal(), |a| {
        let mut x = cfg(a);
        x.accept_timeout = Duration::from_secs(5);
        x.alloc_timeout = Duration::from_secs(10);
        x
    });
    c.register(1, "mute", App::ignore());
    c.allocate(Instant::ZERO, 0, 1, "perf", "mute", QosSpec::default());
    c.world.run_until(at_ms(20_000)).unwrap();
    let withdrawn: Vec<Instant> = c
        .world
        .node_events()
        .filter(|(_, n, e)| *n == c.nodes[1] && matches!(e, NormalEvent::Withdrawn { .. }))
        .map(|(t, _, _)| t)
        .collect();
    assert_eq!(
        withdrawn,
        vec![at_ms(5001)],
        "5 s after the request arrived"
    );
    let a = c.node(0).app(1).unwrap();
    assert_eq!(
        a.alloc_failed,
        Some((
            at_ms(5002),
            NormalError::Refused("the application did not answer in time".into())
        ))
    );
    assert_eq!(
        c.node(1).ipcp().counters().alloc_requests_in,
        21,
        "the first request and 20 repetitions while pending, one FlowRequest"
    );
    assert_eq!(
        c.world
            .node_events()
            .filter(|(_, _, e)| matches!(e, NormalEvent::FlowRequest { .. }))
            .count(),
        1
    );
}

/// A flow end: node, flow id, local CEP-id, remote CEP-id.
type Ends = (usize, u32, u64, u64);

/// Four nodes; three allocate flows to names on other nodes at the same
/// instant over lossy links, then stream. Returns what the run produced.
fn concurrent(seed: u64) -> (u64, Vec<Ends>, Vec<usize>) {
    let mut c = Chain::new(seed, 4, link().loss(0.05), cfg);
    c.register(3, "a", App::echo());
    c.register(0, "b", App::echo());
    c.register(2, "c", App::sink());
    for flow in 1..=3 {
        c.allocate(Instant::ZERO, 0, flow, "x", "a", reliable());
        c.allocate(Instant::ZERO, 3, flow, "y", "b", reliable());
        c.allocate(Instant::ZERO, 1, flow, "z", "c", QosSpec::default());
    }
    for node in [0, 1, 3] {
        for flow in 1..=3 {
            c.stream(at_ms(2000), node, flow, 50, 300, MS);
        }
    }
    c.world.run_until(at_ms(30_000)).unwrap();
    let eps = (0..4)
        .flat_map(|i| {
            let mut v: Vec<_> = c
                .node(i)
                .ipcp()
                .flows()
                .map(|(f, e)| (i, f, e.local_cep, e.remote_cep))
                .collect();
            v.sort();
            v
        })
        .collect();
    let delivered = (0..4)
        .map(|i| c.node(i).apps().values().map(|a| a.delivered.len()).sum())
        .collect();
    (c.world.trace_digest(), eps, delivered)
}

#[test]
fn concurrent_allocations_replay_exactly() {
    let (d1, eps1, del1) = concurrent(11);
    let (d2, eps2, del2) = concurrent(11);
    assert_eq!(d1, d2, "same seed, same trace");
    assert_eq!(eps1, eps2);
    assert_eq!(del1, del2);
    assert_eq!(eps1.len(), 18, "9 flows, two ends each: {eps1:?}");
    // Every reliable flow delivered its 50 SDUs, echoed: 3 x 50 at each end.
    assert_eq!((del1[0], del1[1], del1[3]), (300, 0, 300), "{del1:?}");
    assert!(
        del1[2] > 130,
        "unreliable flows lose about 5% per link: {del1:?}"
    );
    let (d3, ..) = concurrent(12);
    assert_ne!(d1, d3, "another seed, another run");
    eprintln!("concurrent allocations: deliveries per node {del1:?}");
}

/// The CDAP operation and object class of a frame's management payload,
/// if it carries one.
fn cdap_of(frame: &[u8]) -> Option<(OpCode, String)> {
    let c = cfg(1);
    let un = Sdup::without_cipher(c.sdup).unprotect(frame).ok()?;
    let pdu = pci::Pdu::parse(&c.dt, &un.pdu).ok()?;
    let pci::Body::Data(payload) = pdu.body else {
        return None;
    };
    if pdu.pci.pdu_type != pci::PduType::Mgmt || payload.first() != Some(&CDAP_DISCRIMINATOR) {
        return None;
    }
    let m = CdapMessage::decode(&payload[1..]).ok()?;
    Some((m.op_code(), m.obj_class.clone().unwrap_or_default()))
}

/// Loses the first `n` flow-object messages with operation `op`; counts
/// what it lost in the returned cell.
fn lose_first(c: &mut Chain, op: OpCode, n: u32) -> Rc<Cell<u32>> {
    let lost = Rc::new(Cell::new(0));
    let l = lost.clone();
    c.world
        .set_loss_filter(Some(Box::new(move |_, _, frame: &[u8]| {
            let hit = cdap_of(frame).is_some_and(|(o, class)| o == op && class == FLOW_CLASS);
            if hit && l.get() < n {
                l.set(l.get() + 1);
                return true;
            }
            false
        })));
    lost
}

/// Allocates perf→sink over two hops, deallocates at 1 s from `closer`
/// (0: the requester, 2: the responder), losing the first two messages of
/// kind `op`; returns the chain after 10 s.
fn lose_and_repair(op: OpCode, closer: usize) -> Chain {
    let mut c = Chain::new(21, 3, ideal(), cfg);
    c.register(2, "sink", App::sink());
    let lost = lose_first(&mut c, op, 2);
    c.allocate(Instant::ZERO, 0, 1, "perf", "sink", reliable());
    let flow = if closer == 0 { 1 } else { FIRST_ACCEPTED_FLOW };
    c.deallocate(at_ms(1000), closer, flow);
    c.world.run_until(at_ms(10_000)).unwrap();
    assert_eq!(lost.get(), 2, "{op:?}: two messages lost");
    let a = c.node(0).app(1).unwrap();
    assert!(
        a.allocated_at.is_some(),
        "{op:?}: allocated despite the loss"
    );
    assert_eq!(
        c.node(2).accepted_flows().len(),
        1,
        "{op:?}: one flow, no twin"
    );
    for i in [0, 2] {
        assert_eq!(
            c.node(i).ipcp().flows().count(),
            0,
            "{op:?}: node {i} closed"
        );
        assert_eq!(c.node(i).ipcp().deallocs_unacknowledged(), 0, "{op:?}");
        assert_eq!(c.node(i).ipcp().counters().dealloc_unacked, 0, "{op:?}");
    }
    c
}

#[test]
fn losing_any_kind_of_flow_object_message_is_repaired() {
    for closer in [0, 2] {
        let c = lose_and_repair(OpCode::Create, closer);
        let ctr = c.node(0).ipcp().counters();
        assert_eq!(ctr.alloc_retries, 2, "two M_CREATE repeated");
        assert_eq!(c.node(0).app(1).unwrap().allocated_at, Some(at_ms(504)));

        let c = lose_and_repair(OpCode::CreateR, closer);
        assert_eq!(c.node(0).ipcp().counters().alloc_retries, 2);
        assert_eq!(
            c.node(2).ipcp().counters().alloc_requests_in,
            3,
            "the responder answered the repeated M_CREATE again"
        );

        let c = lose_and_repair(OpCode::Delete, closer);
        assert_eq!(c.node(closer).ipcp().counters().dealloc_retries, 2);
        let other = 2 - closer;
        let other_flow = if other == 0 { 1 } else { FIRST_ACCEPTED_FLOW };
        assert_eq!(
            c.node(other).app(other_flow).unwrap().deallocated_at,
            Some(at_ms(1502)),
            "the third M_DELETE, 2 x 250 ms later, reaches the peer"
        );

        let c = lose_and_repair(OpCode::DeleteR, closer);
        assert_eq!(c.node(closer).ipcp().counters().dealloc_retries, 2);
        assert_eq!(
            c.node(2 - closer).ipcp().counters().rx_fa_stale,
            2,
            "the repeated M_DELETEs found the flow gone and were acknowledged again"
        );
    }
}

#[test]
fn a_lost_refusal_is_repeated_with_its_reason() {
    let mut c = Chain::new(22, 3, ideal(), cfg);
    c.register(2, "busy", App::refuse("come back later"));
    let lost = lose_first(&mut c, OpCode::CreateR, 1);
    c.allocate(Instant::ZERO, 0, 1, "perf", "busy", QosSpec::default());
    c.world.run_until(at_ms(1000)).unwrap();
    assert_eq!(lost.get(), 1);
    assert_eq!(
        c.node(0).app(1).unwrap().alloc_failed,
        Some((at_ms(254), NormalError::Refused("come back later".into())))
    );
    assert_eq!(
        c.world
            .node_events()
            .filter(|(_, _, e)| matches!(e, NormalEvent::FlowRequest { .. }))
            .count(),
        1,
        "the application was asked once"
    );
}

#[test]
fn a_deallocation_nobody_acknowledges_is_given_up_after_3_s() {
    let mut c = Chain::new(23, 2, ideal(), cfg);
    c.register(1, "sink", App::sink());
    lose_first(&mut c, OpCode::Delete, u32::MAX);
    c.allocate(Instant::ZERO, 0, 1, "perf", "sink", QosSpec::default());
    c.deallocate(at_ms(100), 0, 1);
    c.world.run_until(at_ms(10_000)).unwrap();
    let ctr = c.node(0).ipcp().counters();
    assert_eq!((ctr.dealloc_retries, ctr.dealloc_unacked), (11, 1));
    assert_eq!(c.node(0).ipcp().deallocs_unacknowledged(), 0);
    assert_eq!(
        c.node(1).ipcp().flows().count(),
        1,
        "the peer never heard (its EFCP or application ends it)"
    );
}
