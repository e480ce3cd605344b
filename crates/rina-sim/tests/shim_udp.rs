//! Simulation tests of the unchanged shim-udp machine over emulated links.
//! Every figure asserted here is in virtual time; each test runs in
//! milliseconds of real time.

use rina_core::shim_udp::{ShimError, DEFAULT_MAX_SDU};
use rina_core::Instant;
use rina_sim::scenario::{addr, micros, millis, name, Pair};
use rina_sim::{App, LinkConfig, NetEvent, ShimEvent, Traced};
use rina_wire::shim_udp::{AllocResult, Datagram, DATA_HEADER_LEN};
use rina_wire::QosSpec;
use std::time::Duration;

const MS10: Duration = Duration::from_millis(10);
/// 8 Mb/s: one byte takes exactly one microsecond to serialize.
const RATE_8M: u64 = 8_000_000;

fn alloc_req_len(src: &str, dst: &str) -> u64 {
    Datagram::AllocReq {
        src_port: 1,
        qos: QosSpec::default(),
        src: name(src),
        dst: name(dst),
        direct: None,
    }
    .to_vec()
    .len() as u64
}

fn alloc_resp_len(reason: &str) -> u64 {
    Datagram::AllocResp {
        dst_port: 1,
        src_port: 1,
        result: AllocResult::Accepted,
        max_sdu: DEFAULT_MAX_SDU,
        reason,
        direct: None,
    }
    .to_vec()
    .len() as u64
}

/// Test 1: allocation over a 10 ms, 8 Mb/s link completes at exactly two
/// propagation delays plus the serialization of request and response.
#[test]
fn allocation_completes_at_two_delays_plus_serialization() {
    let mut p = Pair::new(1, LinkConfig::new(RATE_8M, MS10), &["echo"]);
    p.register_on_b("echo", App::echo());
    let port = p.world.allocate(Instant::ZERO, p.a, "perf", "echo");
    p.world.run_until_idle().unwrap();

    let (req, resp) = (alloc_req_len("perf", "echo"), alloc_resp_len(""));
    let accepted_at = millis(10) + Duration::from_micros(req);
    let expected = accepted_at + MS10 + Duration::from_micros(resp);
    // 20 ms + 46 µs + 16 µs = 20.062 ms with today's encodings.
    assert_eq!(expected, micros(20_000 + req + resp));
    let a = p.world.node(p.a).flow(port).unwrap();
    assert_eq!(a.allocated_at, Some(expected));
    let (&port_b, b) = p.world.node(p.b).flows().iter().next().unwrap();
    assert_eq!(b.allocated_at, Some(accepted_at));
    assert!(p.world.node(p.b).shim().flow(port_b).is_some());

    let events: Vec<_> = p.world.node_events().collect();
    assert!(events.contains(&(
        expected,
        p.a,
        &ShimEvent::Allocated {
            port,
            max_sdu: DEFAULT_MAX_SDU
        }
    )));
    // One request, one response: nothing retransmitted.
    assert_eq!(p.world.link_counters(p.link, addr(1)).sent, 1);
    assert_eq!(p.world.link_counters(p.link, addr(2)).sent, 1);
    assert_eq!(p.world.now(), expected, "idle right after the response");
}

/// An echo application answers, and the round trip is exact too.
#[test]
fn echo_round_trip_time_is_exact() {
    let mut p = Pair::new(1, LinkConfig::new(RATE_8M, MS10), &["echo"]);
    p.register_on_b("echo", App::echo());
    let port = p.world.allocate(Instant::ZERO, p.a, "perf", "echo");
    p.world
        .send_stream(p.a, port, millis(100), 3, 995, Duration::from_millis(1));
    p.world.run_until_idle().unwrap();
    let back = p.world.delivered(p.a, port);
    assert_eq!(back.len(), 3);
    // 1000-byte datagrams: 1 ms serialization + 10 ms each way.
    for (i, d) in back.iter().enumerate() {
        assert_eq!(d.tag, i as u64);
        assert_eq!(d.len, 995);
        assert_eq!(d.at, millis(100 + i as u64 + 22));
    }
}

/// Test 2: with 50 % loss each way, retransmission gets the flow through for
/// a fixed seed, and it took more than one request.
#[test]
fn allocation_survives_fifty_percent_loss_by_retransmission() {
    let link = LinkConfig::new(RATE_8M, MS10).loss(0.5);
    let mut p = Pair::new(7, link, &["echo"]);
    p.register_on_b("echo", App::sink());
    let port = p.world.allocate(Instant::ZERO, p.a, "perf", "echo");
    p.world.run_until_idle().unwrap();

    let a = p.world.node(p.a).flow(port).unwrap();
    let at = a.allocated_at.expect("allocated despite the loss");
    let reqs = p.world.link_counters(p.link, addr(1));
    let resps = p.world.link_counters(p.link, addr(2));
    println!("seed 7: allocated at {at:?}; A->B {reqs:?}; B->A {resps:?}");
    assert!(reqs.sent > 1, "requests were retransmitted: {reqs:?}");
    assert_eq!(reqs.sent, p.world.node(p.a).shim().counters().tx_datagrams);
    assert_eq!(reqs.sent, reqs.delivered + reqs.dropped_loss);
    // Retransmissions go every 200 ms, so success lands one RTT after one.
    let rtt = 20_000 + alloc_req_len("perf", "echo") + alloc_resp_len("");
    assert_eq!(at.as_nanos() % 200_000_000, rtt * 1_000);
    // The retransmitted requests made one flow at B, not several.
    assert_eq!(p.world.node(p.b).shim().flows().count(), 1);
}

/// Over many seeds the success rate of allocation under 50 % loss each way
/// matches the model: ten attempts (t = 0, 0.2, ..., 1.8 s) each succeed
/// with probability 0.5 * 0.5, so P(success) = 1 - 0.75^10 = 0.9437.
#[test]
fn allocation_success_rate_under_loss_matches_the_model() {
    let seeds = 400u64;
    let mut ok = 0u64;
    for seed in 0..seeds {
        let mut p = Pair::new(seed, LinkConfig::new(RATE_8M, MS10).loss(0.5), &["echo"]);
        p.register_on_b("echo", App::sink());
        p.world.set_tracing(false);
        let port = p.world.allocate(Instant::ZERO, p.a, "perf", "echo");
        p.world.run_until_idle().unwrap();
        let f = p.world.node(p.a).flow(port).unwrap();
        assert!(f.allocated_at.is_some() != f.failed.is_some());
        ok += f.allocated_at.is_some() as u64;
    }
    let p = 1.0 - 0.75f64.powi(10);
    let mean = seeds as f64 * p;
    let sd = (seeds as f64 * p * (1.0 - p)).sqrt();
    println!("{ok}/{seeds} allocations succeeded; model {mean:.1} +- {sd:.1}");
    assert!(
        (ok as f64 - mean).abs() <= 4.0 * sd,
        "{ok} vs {mean:.1} +- 4*{sd:.1}"
    );
}

/// Test 3: a dead peer (100 % loss) makes allocation fail with a timeout at
/// exactly the allocation timeout, after ten requests.
#[test]
fn allocation_to_a_dead_peer_times_out_at_exactly_two_seconds() {
    let mut p = Pair::new(3, LinkConfig::new(RATE_8M, MS10).loss(1.0), &["echo"]);
    p.register_on_b("echo", App::sink());
    let port = p.world.allocate(Instant::ZERO, p.a, "perf", "echo");
    p.world.run_until_idle().unwrap();

    let f = p.world.node(p.a).flow(port).unwrap();
    assert_eq!(f.allocated_at, None);
    assert_eq!(
        f.failed,
        Some((
            millis(2000),
            ShimError::Timeout {
                peer: addr(2),
                after: Duration::from_secs(2)
            }
        ))
    );
    let c = p.world.link_counters(p.link, addr(1));
    assert_eq!((c.sent, c.dropped_loss, c.delivered), (10, 10, 0));
    assert_eq!(p.world.node(p.a).shim().counters().alloc_timeouts, 1);
    assert_eq!(p.world.now(), millis(2000));
    assert!(p.world.node(p.a).shim().flow(port).is_none());
}

/// Test 4a: 1000 SDUs of 1000 B offered at 16 Mb/s to a 10 Mb/s link with a
/// 50-datagram queue. Every datagram is either delivered or dropped at the
/// queue, and the delivery rate is the link rate.
#[test]
fn overload_delivers_at_link_rate_and_drops_at_the_queue() {
    let rate = 10_000_000;
    let link = LinkConfig::new(rate, MS10).queue(50);
    let mut p = Pair::new(11, link, &["sink"]);
    p.register_on_b("sink", App::sink());
    let port = p.world.allocate(Instant::ZERO, p.a, "perf", "sink");
    let (n, size) = (1000u64, 1000usize);
    // One SDU every 500 µs: 1005 B * 8 / 500 µs = 16.08 Mb/s offered.
    p.world
        .send_stream(p.a, port, millis(100), n, size, Duration::from_micros(500));
    p.world.run_until_idle().unwrap();

    let c = p.world.link_counters(p.link, addr(1));
    let got = p.world.delivered(p.b, 1);
    assert_eq!(p.world.node(p.a).flow(port).unwrap().written, n);
    assert_eq!(c.sent, n + 1, "data plus the allocation request");
    assert_eq!(c.dropped_loss, 0);
    assert!(c.dropped_queue > 0);
    assert_eq!(got.len() as u64, n - c.dropped_queue);
    // Tags arrive in order (FIFO, no jitter).
    assert!(got.windows(2).all(|w| w[0].tag < w[1].tag));

    // The link is busy from the first data datagram on, so deliveries are
    // back to back: (k - 1) datagrams of 1005 B between first and last.
    let span = got.last().unwrap().at - got[0].at;
    let bits = (got.len() as u64 - 1) * (size + DATA_HEADER_LEN) as u64 * 8;
    let measured = bits as f64 / span.as_secs_f64();
    let expected_drops = {
        // Offered for 499.5 ms; the link serves 1005 B in 804 µs and holds 50.
        let served = (999.0 * 500.0 / 804.0f64).floor() as u64 + 1;
        n - served - 50 + 1
    };
    println!(
        "delivered {} of {n}, queue drops {}, (model ~{expected_drops}), rate {:.0} b/s",
        got.len(),
        c.dropped_queue,
        measured
    );
    assert!(
        (measured - rate as f64).abs() / (rate as f64) < 0.001,
        "rate {measured} within 0.1 % of {rate}"
    );
    assert!(c.dropped_queue.abs_diff(expected_drops) <= 2);
}

/// Test 4b: with 1 % loss and no congestion, the measured loss is within
/// four binomial standard deviations of 1 %, for each of 10 seeds, and the
/// pooled loss within four pooled standard deviations.
#[test]
fn random_loss_matches_the_configured_probability() {
    let (n, p_loss) = (10_000u64, 0.01);
    let sd = (n as f64 * p_loss * (1.0 - p_loss)).sqrt(); // 9.95 datagrams
    let mut pooled = 0u64;
    for seed in 100..110 {
        let link = LinkConfig::new(100_000_000, MS10).loss(p_loss);
        // Allocation copes with the loss by retransmitting; the data-loss
        // count below excludes those control datagrams.
        let mut p = Pair::new(seed, link, &["sink"]);
        p.register_on_b("sink", App::sink());
        p.world.set_tracing(false);
        let port = p.world.allocate(Instant::ZERO, p.a, "perf", "sink");
        p.world.run_until(millis(1000)).unwrap();
        assert!(p.world.node(p.a).flow(port).unwrap().allocated_at.is_some());
        let before = p.world.link_counters(p.link, addr(1));
        p.world
            .send_stream(p.a, port, millis(1000), n, 1000, Duration::from_micros(100));
        p.world.run_until_idle().unwrap();
        let after = p.world.link_counters(p.link, addr(1));
        let lost = after.dropped_loss - before.dropped_loss;
        let got = p.world.delivered(p.b, 1).len() as u64;
        assert_eq!(after.dropped_queue, 0);
        assert_eq!(got + lost, n);
        println!(
            "seed {seed}: lost {lost} of {n} ({:.3} %)",
            lost as f64 / n as f64 * 100.0
        );
        assert!(
            (lost as f64 - n as f64 * p_loss).abs() <= 4.0 * sd,
            "seed {seed}: {lost} lost, expected 100 +- {:.0}",
            4.0 * sd
        );
        pooled += lost;
    }
    let total = 10 * n;
    let psd = (total as f64 * p_loss * (1.0 - p_loss)).sqrt();
    println!("pooled: {pooled} of {total}, expected 1000 +- {psd:.1}");
    assert!((pooled as f64 - total as f64 * p_loss).abs() <= 4.0 * psd);
}

fn lossy_trace(seed: u64) -> (Vec<String>, u64) {
    let link = LinkConfig::new(RATE_8M, MS10)
        .loss(0.2)
        .jitter(Duration::from_millis(3));
    let mut p = Pair::new(seed, link, &["echo"]);
    p.register_on_b("echo", App::echo());
    let port = p.world.allocate(Instant::ZERO, p.a, "perf", "echo");
    p.world
        .send_stream(p.a, port, millis(500), 200, 300, Duration::from_millis(1));
    p.world.run_until_idle().unwrap();
    let lines = p
        .world
        .trace()
        .iter()
        .map(|e| format!("{} {:?}", e.at.as_nanos(), e.what))
        .collect();
    (lines, p.world.trace_digest())
}

/// Test 5: the same seed gives an identical trace; another seed does not.
#[test]
fn same_seed_same_trace_other_seed_other_trace() {
    let (t1, d1) = lossy_trace(2024);
    let (t2, d2) = lossy_trace(2024);
    let (t3, d3) = lossy_trace(2025);
    println!(
        "{} trace lines; digests {d1:016x} {d2:016x} {d3:016x}",
        t1.len()
    );
    assert!(t1.len() > 500);
    assert_eq!(t1, t2);
    assert_eq!(d1, d2);
    assert_ne!(t1, t3);
    assert_ne!(d1, d3);
}

/// Test 6a: the application refuses; the requester learns it one round trip
/// later, with the reason.
#[test]
fn refusal_reaches_the_requester_with_its_reason() {
    let mut p = Pair::new(1, LinkConfig::new(RATE_8M, MS10), &["busy"]);
    p.register_on_b("busy", App::refuse("try later"));
    let port = p.world.allocate(Instant::ZERO, p.a, "perf", "busy");
    p.world.run_until_idle().unwrap();
    let at = micros(20_000 + alloc_req_len("perf", "busy") + alloc_resp_len("try later"));
    assert_eq!(
        p.world.node(p.a).flow(port).unwrap().failed,
        Some((at, ShimError::Refused("try later".into())))
    );
    assert_eq!(p.world.node(p.b).shim().counters().alloc_refused, 1);
    assert_eq!(p.world.node(p.b).shim().flows().count(), 0);
    assert!(p
        .world
        .node_events()
        .any(|(_, n, e)| n == p.b && matches!(e, ShimEvent::Refused { .. })));
}

/// Test 6b: a name in A's directory that nobody registered at B is refused
/// by B's shim (not silently dropped); a name in no directory fails at once.
#[test]
fn unregistered_and_unknown_names_fail_cleanly() {
    let mut p = Pair::new(1, LinkConfig::new(RATE_8M, MS10), &["ghost"]);
    let ghost = p.world.allocate(Instant::ZERO, p.a, "perf", "ghost");
    let nowhere = p.world.allocate(Instant::ZERO, p.a, "perf", "nowhere");
    p.world.run_until_idle().unwrap();
    let reason = "ghost is not registered";
    let at = micros(20_000 + alloc_req_len("perf", "ghost") + alloc_resp_len(reason));
    let a = p.world.node(p.a);
    assert_eq!(
        a.flow(ghost).unwrap().failed,
        Some((
            at,
            ShimError::NotRegistered {
                name: Box::new(name("ghost")),
                peer: addr(2)
            }
        ))
    );
    assert_eq!(
        a.flow(nowhere).unwrap().failed,
        Some((
            Instant::ZERO,
            ShimError::NameNotFound(Box::new(name("nowhere")))
        ))
    );
    // B never bothered an application.
    assert!(!p
        .world
        .node_events()
        .any(|(_, n, e)| n == p.b && matches!(e, ShimEvent::FlowRequest { .. })));
    assert_eq!(p.world.link_counters(p.link, addr(1)).sent, 1);
}

/// An application that never answers: the requester gives up at 2 s, the
/// responder withdraws at its 5 s accept timeout and its late refusal is
/// ignored by the requester.
#[test]
fn a_silent_application_is_refused_for_before_the_requester_gives_up() {
    let mut p = Pair::new(1, LinkConfig::new(RATE_8M, MS10), &["mute"]);
    p.register_on_b("mute", App::ignore());
    let port = p.world.allocate(Instant::ZERO, p.a, "perf", "mute");
    p.world.run_until_idle().unwrap();
    let accept = p.world.node(p.b).shim().config().accept_timeout;
    let patience = p.world.node(p.a).shim().config().alloc_timeout;
    assert!(accept < patience);
    let req_arrival = millis(10) + Duration::from_micros(alloc_req_len("perf", "mute"));
    let withdrawn: Vec<_> = p
        .world
        .node_events()
        .filter(|(_, n, e)| *n == p.b && matches!(e, ShimEvent::Withdrawn { .. }))
        .map(|(t, _, _)| t)
        .collect();
    assert_eq!(withdrawn, vec![req_arrival + accept]);
    // The refusal crosses the link (10 ms and its bytes) before the
    // requester's patience ends: it hears why.
    let f = p.world.node(p.a).flow(port).unwrap();
    match &f.failed {
        Some((t, ShimError::Refused(why))) => {
            assert!(why.contains("did not answer in time"), "{why}");
            assert!(
                *t > req_arrival + accept + MS10 && *t < Instant::ZERO + patience,
                "{t:?}"
            );
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    // Retransmitted requests (every 200 ms until the refusal came) did not
    // create more pending requests.
    let sent_before_refusal = 1 + (accept.as_millis() as u64 + 10) / 200;
    assert_eq!(
        p.world.node(p.b).shim().counters().alloc_requests_in,
        sent_before_refusal
    );
    let asked = p
        .world
        .node_events()
        .filter(|(_, _, e)| matches!(e, ShimEvent::FlowRequest { .. }))
        .count();
    assert_eq!(asked, 1);
}

/// Deallocation crosses the link and reaches the peer one delay later.
#[test]
fn deallocation_reaches_the_peer() {
    let mut p = Pair::new(1, LinkConfig::new(RATE_8M, MS10), &["echo"]);
    p.register_on_b("echo", App::sink());
    let port = p.world.allocate(Instant::ZERO, p.a, "perf", "echo");
    p.world
        .schedule(millis(100), p.a, rina_sim::Command::Deallocate { port });
    p.world.run_until_idle().unwrap();
    let dealloc_len = Datagram::Dealloc {
        dst_port: 1,
        src_port: 1,
    }
    .to_vec()
    .len() as u64;
    let (_, b) = p.world.node(p.b).flows().iter().next().unwrap();
    assert_eq!(b.deallocated_at, Some(micros(110_000 + dealloc_len)));
    assert_eq!(p.world.node(p.b).shim().flows().count(), 0);
}

/// Datagrams to an address no link reaches are counted, not lost silently,
/// and a run with a step limit stops instead of looping.
#[test]
fn no_route_is_traced_and_step_limit_stops_a_run() {
    let mut p = Pair::new(1, LinkConfig::new(RATE_8M, MS10), &["echo"]);
    // Point A's "far" at an address with no link.
    let mut far = Pair::with_config(1, LinkConfig::new(RATE_8M, MS10), &[], |c| {
        c.directory.insert(name("far"), addr(9));
    });
    let port = far.world.allocate(Instant::ZERO, far.a, "perf", "far");
    far.world.run_until_idle().unwrap();
    assert!(far.world.trace().iter().any(|e| matches!(
        e.what,
        Traced::Net {
            what: NetEvent::NoRoute,
            ..
        }
    )));
    assert!(matches!(
        far.world.node(far.a).flow(port).unwrap().failed,
        Some((_, ShimError::Timeout { .. }))
    ));

    p.register_on_b("echo", App::sink());
    let port = p.world.allocate(Instant::ZERO, p.a, "perf", "echo");
    p.world
        .send_stream(p.a, port, millis(100), 1000, 100, Duration::from_micros(10));
    p.world.set_step_limit(50);
    assert!(matches!(
        p.world.run_until_idle(),
        Err(rina_sim::SimError::StepLimit { steps: 50, .. })
    ));
    // And it can carry on where it stopped.
    p.world.set_step_limit(1_000_000);
    p.world.run_until_idle().unwrap();
    assert_eq!(p.world.delivered(p.b, 1).len(), 1000);
}

/// Several allocations in progress at once under loss replay exactly: the
/// shim retransmits in port-id order (it once iterated a `HashMap`, whose
/// random order changed which requests the link lost from run to run).
#[test]
fn concurrent_allocations_are_deterministic() {
    let run = |seed| {
        let link = LinkConfig::new(RATE_8M, MS10).loss(0.5);
        let mut p = Pair::new(seed, link, &["echo"]);
        p.register_on_b("echo", App::sink());
        for _ in 0..8 {
            p.world.allocate(Instant::ZERO, p.a, "perf", "echo");
        }
        p.world.run_until_idle().unwrap();
        p.world.trace_digest()
    };
    for seed in 0..20 {
        assert_eq!(run(seed), run(seed), "seed {seed}");
    }
}
