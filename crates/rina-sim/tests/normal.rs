//! Simulation tests of the normal DIF's data path: unchanged rina-core
//! normal IPCPs (delimiting, EFCP, PCI, SDU protection, RMT) in chains of
//! emulated links, with static routes. Deterministic: fixed seeds, virtual time.

mod common;

use common::{base_cfg as cfg, link, tags, MS};
use rina_core::efcp::{DtcpConfig, EfcpConfig, WindowFc};
use rina_core::Instant;
use rina_sim::chain::Chain;
use rina_sim::{LinkConfig, NormalCommand};
use std::time::Duration;

fn secs(n: u64) -> Instant {
    Instant::ZERO + Duration::from_secs(n)
}

#[test]
fn a_three_node_chain_relays_end_to_end() {
    let mut c = Chain::new(1, 3, link(), cfg);
    c.open_flow(0, 2, 7, EfcpConfig::unreliable());
    c.stream(Instant::ZERO, 0, 7, 100, 500, MS);
    c.world.run_until(secs(1)).unwrap();
    assert_eq!(tags(&c, 2, 7), (0..100).collect::<Vec<_>>());
    let mid = c.node(1).ipcp().counters();
    assert_eq!(mid.relayed, 100, "the middle IPCP relays every PDU");
    assert_eq!(c.node(1).ipcp().rmt().counters().relayed, 100);
    assert_eq!(c.node(0).ipcp().counters().tx_frames, 100);
}

#[test]
fn a_reliable_flow_over_5_percent_loss_delivers_everything_once_in_order() {
    let mut c = Chain::new(7, 3, link().loss(0.05), cfg);
    c.open_flow(0, 2, 1, EfcpConfig::reliable());
    c.stream(Instant::ZERO, 0, 1, 5000, 1000, Duration::ZERO);
    c.world.run_until(secs(60)).unwrap();
    assert_eq!(tags(&c, 2, 1), (0..5000).collect::<Vec<_>>());
    let st = c.node(0).ipcp().flow_stats(1).unwrap();
    assert!(st.pdus_retransmitted > 0, "losses were repaired: {st:?}");
    assert_eq!(st.failures, 0);
    eprintln!(
        "5% loss per link, 2 links: 5000 SDUs, {} retransmissions, {} RTO expirations, {} fast retransmits",
        st.pdus_retransmitted, st.rto_expirations, st.fast_retransmits
    );
}

#[test]
fn a_flow_controlled_flow_never_overruns_a_slow_receiver() {
    // Window flow control without retransmission (the seeds' VM-to-VM case).
    let buffer = 32;
    let policy = EfcpConfig {
        in_order: true,
        max_sdu_gap: None,
        dtcp: Some(DtcpConfig {
            cc: None,
            window: Some(WindowFc {
                initial_credit: buffer as u64,
                max_closed_queue: 16,
                receiver_buffer: buffer,
            }),
            rate: None,
            rtx: None,
        }),
        ..EfcpConfig::unreliable()
    };
    let mut c = Chain::new(3, 2, link(), cfg);
    c.open_flow(0, 1, 1, policy);
    c.node_mut(1).ipcp_mut().set_auto_consume(1, false).unwrap();
    // The receiver reads one SDU every 2 ms; the sender writes as fast as allowed.
    for k in 0..1000u64 {
        let node = c.nodes[1];
        c.world.schedule(
            Instant::ZERO + MS * 2 * k as u32,
            node,
            NormalCommand::Consume { flow: 1 },
        );
    }
    c.stream(Instant::ZERO, 0, 1, 400, 1000, Duration::ZERO);
    c.world.run_until(secs(3)).unwrap();
    let rx = c.node(1).app(1).unwrap();
    assert_eq!(
        rx.delivered.iter().map(|d| d.tag).collect::<Vec<_>>(),
        (0..400).collect::<Vec<_>>(),
        "nothing lost: the sender was held back, not the receiver overrun"
    );
    assert!(
        rx.max_unread <= buffer,
        "unread SDUs peaked at {} with a buffer of {buffer}",
        rx.max_unread
    );
    let tx = c.node(0).app(1).unwrap();
    assert!(tx.blocked > 0, "the sender was told to wait");
    // 400 SDUs at one per 2 ms take about 800 ms, not the 35 ms the link could do.
    let last = rx.delivered.last().unwrap().at;
    assert!(last > Instant::ZERO + MS * 700, "finished at {last:?}");
}

#[test]
fn an_unreliable_flow_with_a_max_gap_delivers_with_holes_and_never_blocks() {
    let policy = EfcpConfig {
        in_order: true,
        max_sdu_gap: Some(3),
        ..EfcpConfig::unreliable()
    };
    let mut c = Chain::new(11, 2, link().loss(0.1), cfg);
    c.open_flow(0, 1, 1, policy);
    c.stream(Instant::ZERO, 0, 1, 2000, 200, MS / 2);
    c.world.run_until(secs(5)).unwrap();
    let got = tags(&c, 1, 1);
    let n = got.len();
    assert!(n < 2000 && n > 1700, "about 10% lost: {n} delivered");
    assert!(
        got.windows(2).all(|w| w[0] < w[1]),
        "in order, no duplicates"
    );
    assert_eq!(
        *got.last().unwrap(),
        1999,
        "delivery never stalled behind a hole"
    );
    let tx = c.node(0).app(1).unwrap();
    assert_eq!(
        (tx.written, tx.blocked),
        (2000, 0),
        "the writer never blocked"
    );
    let st = c.node(1).ipcp().flow_stats(1).unwrap();
    assert!(st.holes > 0, "{st:?}");
}

#[test]
fn sdus_of_64_kib_cross_a_dif_whose_max_pdu_is_1400_bytes() {
    let mut c = Chain::new(5, 3, link().loss(0.01), cfg);
    c.open_flow(0, 2, 1, EfcpConfig::reliable());
    c.stream(Instant::ZERO, 0, 1, 20, 65_536, Duration::ZERO);
    c.world.run_until(secs(30)).unwrap();
    let rx = c.node(2).app(1).unwrap();
    assert_eq!(rx.delivered.len(), 20);
    assert!(rx.delivered.iter().all(|d| d.len == 65_536));
    assert_eq!(
        rx.delivered.iter().map(|d| d.tag).collect::<Vec<_>>(),
        (0..20).collect::<Vec<_>>()
    );
    let frames = c.node(0).ipcp().counters().tx_frames;
    assert!(
        frames >= 20 * 48,
        "each SDU took at least 48 PDUs: {frames}"
    );
}

#[test]
fn a_pdu_whose_ttl_runs_out_is_dropped_and_counted() {
    let mut c = Chain::new(2, 3, link(), cfg);
    c.open_flow(0, 2, 1, EfcpConfig::unreliable());
    // A routing loop: node 1 sends traffic for node 3 back to node 0, and
    // node 0 sends it to node 1.
    c.node_mut(1)
        .ipcp_mut()
        .rmt_mut()
        .table_mut()
        .set(3, None, vec![rina_sim::chain::LEFT]);
    c.stream(Instant::ZERO, 0, 1, 1, 100, MS);
    c.world.run_until(secs(1)).unwrap();
    assert!(tags(&c, 2, 1).is_empty());
    let expired =
        c.node(0).ipcp().counters().rx_ttl_expired + c.node(1).ipcp().counters().rx_ttl_expired;
    assert_eq!(expired, 1, "the looping PDU died once, after 64 hops");
    let hops = c.node(0).ipcp().counters().relayed + c.node(1).ipcp().counters().relayed;
    assert_eq!(hops, 63, "relayed 63 times before the TTL ran out");
}

#[test]
fn a_corrupted_pdu_is_dropped_and_counted_when_crc_is_on() {
    let mut c = Chain::new(4, 2, link(), cfg);
    c.open_flow(0, 1, 1, EfcpConfig::unreliable());
    let b = c.nodes[1];
    c.world
        .schedule(Instant::ZERO, b, NormalCommand::CorruptNextRx(3));
    c.stream(Instant::ZERO, 0, 1, 10, 300, MS);
    c.world.run_until(secs(1)).unwrap();
    assert_eq!(tags(&c, 1, 1), (3..10).collect::<Vec<_>>());
    assert_eq!(c.node(1).ipcp().counters().rx_bad_protection, 3);
}

#[test]
fn a_hundred_thousand_pdus_across_five_hops_is_fast_and_deterministic() {
    let run = |seed| {
        let mut c = Chain::new(
            seed,
            6,
            LinkConfig::new(1_000_000_000, MS).queue(10_000),
            cfg,
        );
        c.open_flow(0, 5, 1, EfcpConfig::reliable());
        c.stream(Instant::ZERO, 0, 1, 100_000, 1000, Duration::ZERO);
        c.world.set_tracing(false);
        c.world.set_step_limit(50_000_000);
        let started = std::time::Instant::now();
        c.world.run_until(secs(60)).unwrap();
        let wall = started.elapsed();
        let rx = c.node(5).app(1).unwrap();
        let last = rx.delivered.last().map(|d| d.at);
        (rx.delivered.len(), last, c.world.steps(), wall)
    };
    let (n, last, steps, wall) = run(9);
    assert_eq!(n, 100_000);
    eprintln!("100 000 PDUs over 5 hops: {steps} events, virtual {last:?}, wall {wall:?}");
    assert!(wall < Duration::from_secs(30), "took {wall:?}");
    let (n2, last2, steps2, _) = run(9);
    assert_eq!((n, last, steps), (n2, last2, steps2), "same seed, same run");
}

#[test]
fn losing_the_first_pdu_of_a_reliable_flow_costs_one_retransmission_not_the_run() {
    // The receiver's first frame (the DRF PDU) is corrupted and dropped by
    // the CRC check; the PDUs behind it are held until the sender's
    // retransmission of the first one starts the run (the 9 that the
    // initial congestion window of 10 let go before the first ack).
    let mut c = Chain::new(12, 2, link(), cfg);
    c.open_flow(0, 1, 1, EfcpConfig::reliable());
    let b = c.nodes[1];
    c.world
        .schedule(Instant::ZERO, b, NormalCommand::CorruptNextRx(1));
    c.stream(Instant::ZERO, 0, 1, 50, 100, Duration::ZERO);
    c.world.run_until(secs(5)).unwrap();
    assert_eq!(tags(&c, 1, 1), (0..50).collect::<Vec<_>>());
    let rx = c.node(1).ipcp().flow_stats(1).unwrap();
    assert_eq!((rx.held_no_run, rx.dropped_no_run), (9, 0), "{rx:?}");
    let tx = c.node(0).ipcp().flow_stats(1).unwrap();
    assert_eq!(
        tx.pdus_retransmitted, 1,
        "only the lost PDU was sent again: {tx:?}"
    );
}

/// A reliable cube whose sequence numbers in flight fit one byte's half
/// (window 48 plus a reordering queue of 32).
fn one_byte_reliable() -> EfcpConfig {
    let mut e = EfcpConfig::reliable();
    e.max_reorder = 32;
    if let Some(d) = e.dtcp.as_mut() {
        d.window = Some(WindowFc {
            initial_credit: 16,
            max_closed_queue: 16,
            receiver_buffer: 48,
        });
    }
    e
}

#[test]
fn one_byte_sequence_numbers_wrap_many_times_on_a_lossy_reliable_flow() {
    // Data and control sequence numbers one byte wide: 5,000 SDUs wrap the
    // data numbers about 20 times and the control numbers as often. Every
    // SDU arrives once and in order, and the control PDUs stay fresh after
    // the wrap (nacks and duplicate acks keep working), rather than all
    // being taken as stale once the control number wrapped.
    let narrow = |addr| {
        let mut c = cfg(addr);
        c.dt.seq = rina_wire::pci::FieldWidth::W1;
        c.dt.ctrl_seq = rina_wire::pci::FieldWidth::W1;
        c.cubes[1].efcp = one_byte_reliable();
        c.cubes[0].efcp.max_reorder = 32;
        c
    };
    let mut c = Chain::new(21, 2, link().loss(0.05), narrow);
    c.open_flow(0, 1, 1, one_byte_reliable());
    c.stream(Instant::ZERO, 0, 1, 5000, 200, Duration::ZERO);
    c.world.run_until(secs(120)).unwrap();
    assert_eq!(tags(&c, 1, 1), (0..5000).collect::<Vec<_>>());
    let tx = c.node(0).ipcp().flow_stats(1).unwrap();
    let rx = c.node(1).ipcp().flow_stats(1).unwrap();
    assert_eq!(tx.failures, 0);
    assert!(
        tx.ctrl_stale < tx.acks_received / 10,
        "control PDUs taken as stale after the wrap: {tx:?}"
    );
    assert!(
        tx.nacks_received * 2 > rx.nacks_sent,
        "nacks ignored after the wrap: sent {}, taken {}",
        rx.nacks_sent,
        tx.nacks_received
    );
}
