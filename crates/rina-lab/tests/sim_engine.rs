//! The `sim` backend's engines on small inline experiments: QoS
//! differentiation at a congested link (the protocol engine, and the
//! queueing approximation compared with it), the same through a stack of
//! DIFs, rerouting around a link that goes down, an application that
//! moves, determinism and interruption.

use rina_lab::backend::sim::{Engine, Sim};
use rina_lab::backend::{Backend, RunCtx};
use rina_lab::results::{ClassSummary, RunOutput};
use rina_lab::{load, LabError};
use std::sync::atomic::AtomicBool;

fn run_with(text: &str, variant: Option<&str>, stop: bool) -> Result<RunOutput, LabError> {
    run_on(text, variant, stop, None)
}

fn run_on(
    text: &str,
    variant: Option<&str>,
    stop: bool,
    engine: Option<Engine>,
) -> Result<RunOutput, LabError> {
    let exp = load(text, variant).expect("experiment resolves");
    let stop = AtomicBool::new(stop);
    let progress = |_: f64, _: &str| {};
    let dir = std::env::temp_dir();
    let ctx = RunCtx {
        dir: &dir,
        progress: &progress,
        stop: &stop,
    };
    Sim {
        engine,
        ..Default::default()
    }
    .run_once(&exp, &ctx)
}

fn run(text: &str, variant: Option<&str>) -> RunOutput {
    let out = run_with(text, variant, false).expect("run succeeds");
    print!("{}", out.summary_table());
    out
}

fn class(out: &RunOutput, c: &str) -> ClassSummary {
    out.summary()
        .into_iter()
        .find(|x| x.class == c)
        .unwrap_or_else(|| panic!("no class {c}"))
}

/// Two systems, a 10 Mb/s link, 12 Mb/s offered: 3 Mb/s urgent CBR and
/// 9 Mb/s of bulk Poisson traffic, bulk also less cherished (dropped
/// first).
const CONGESTED: &str = r#"
nodes = ["a", "b"]

[experiment]
name = "congested"
duration = "4s"
seed = 7

[[link]]
between = ["a", "b"]
rate = "10Mbps"
delay = "1ms"

[[dif]]
name = "net"
members = ["a", "b"]
over = ["links"]
scheduler = { policy = "qta-mux", cherish_thresholds = [300, 250] }
[[dif.cube]]
name = "urgent"
urgency = 0
cherish = 0
[[dif.cube]]
name = "bulk"
urgency = 1
cherish = 1

[[profile]]
name = "urgent"
profile = "cbr"
rate = "3Mbps"
size = 1000
cube = "urgent"

[[profile]]
name = "bulk"
profile = "poisson"
rate = "9Mbps"
size = 1000
cube = "bulk"

[[traffic]]
kind = "tgen"
dif = "net"
profiles = ["urgent", "bulk"]
pairs = [["a", "b"]]

[[variant]]
name = "qta"

[[variant]]
name = "fifo"
scheduler.net = { policy = "fifo", queue_len = 300 }
"#;

#[test]
fn qta_mux_gives_urgent_traffic_low_delay_at_a_congested_link_and_fifo_does_not() {
    // The protocol engine (the real systems), then the queueing
    // approximation on the same file: the same pattern, and figures close
    // to the protocol engine's.
    let mut bulk_loss = Vec::new();
    for engine in [Engine::Protocol, Engine::Queueing] {
        let go = |v| {
            let out = run_on(CONGESTED, Some(v), false, Some(engine)).unwrap();
            print!("{engine:?} {v}\n{}", out.summary_table());
            out
        };
        let qta = go("qta");
        let (u, b) = (class(&qta, "urgent"), class(&qta, "bulk"));
        let (ud, bd) = (u.avg_ms.unwrap(), b.avg_ms.unwrap());
        assert!(ud < 5.0, "{engine:?}: urgent waits little: {ud} ms");
        assert!(bd > 10.0 * ud, "{engine:?}: bulk waits: {bd} ms vs {ud} ms");
        assert_eq!(u.loss_pct, 0.0, "{engine:?}: urgent loses nothing");
        assert!(
            b.loss_pct > 5.0,
            "{engine:?}: the excess is bulk's: {}",
            b.loss_pct
        );
        bulk_loss.push(b.loss_pct);

        let fifo = go("fifo");
        let (u, b) = (class(&fifo, "urgent"), class(&fifo, "bulk"));
        let (ud, bd) = (u.avg_ms.unwrap(), b.avg_ms.unwrap());
        assert!(ud > 50.0, "{engine:?}: urgent queues behind bulk: {ud} ms");
        assert!(
            (ud - bd).abs() < 0.2 * bd,
            "{engine:?}: same delay: {ud} vs {bd}"
        );
        assert!(
            u.loss_pct > 1.0,
            "{engine:?}: urgent loses too: {}",
            u.loss_pct
        );
        // The link was full in both runs.
        for out in [&qta, &fifo] {
            let l = &out.links[0];
            assert!(
                l.avg_bps_ab > 9.5e6 && l.avg_bps_ab <= 10e6,
                "{engine:?}: {}",
                l.avg_bps_ab
            );
            if engine == Engine::Protocol {
                // The shim paces the N-1 flow at the link's rate: the
                // excess waits and is dropped in the RMT, by the policy,
                // not at the link.
                assert_eq!(l.dropped, 0, "the link dropped frames");
            }
        }
    }
    assert!(
        (bulk_loss[0] - bulk_loss[1]).abs() < 5.0,
        "bulk loss: protocol {} %, queueing {} %",
        bulk_loss[0],
        bulk_loss[1]
    );
}

/// An upper DIF `up` between a and c over a lower DIF `low` of a, b, c;
/// the b--c link is the bottleneck. The upper DIF always differentiates;
/// the lower DIF does (cubes mapped one to one) or is a FIFO.
const STACK: &str = r#"
nodes = ["a", "b", "c"]

[experiment]
name = "stack"
duration = "4s"
seed = 9

[[link]]
between = ["a", "b"]
rate = "100Mbps"
delay = "1ms"

[[link]]
between = ["b", "c"]
rate = "10Mbps"
delay = "1ms"

[[dif]]
name = "low"
members = ["a", "b", "c"]
over = ["links"]
scheduler = { policy = "qta-mux", cherish_thresholds = [300, 250] }
[[dif.cube]]
name = "hi"
urgency = 0
cherish = 0
[[dif.cube]]
name = "lo"
urgency = 1
cherish = 1

[[dif]]
name = "up"
members = ["a", "c"]
over = ["low"]
scheduler = { policy = "qta-mux", cherish_thresholds = [300, 250] }
[[dif.cube]]
name = "hi"
urgency = 0
cherish = 0
maps_to = { low = "hi" }
[[dif.cube]]
name = "lo"
urgency = 1
cherish = 1
maps_to = { low = "lo" }

[[profile]]
name = "hi"
profile = "cbr"
rate = "3Mbps"
size = 1000
cube = "hi"

[[profile]]
name = "lo"
profile = "poisson"
rate = "9Mbps"
size = 1000
cube = "lo"

[[traffic]]
kind = "tgen"
dif = "up"
profiles = ["hi", "lo"]
pairs = [["a", "c"]]

[[variant]]
name = "both"

[[variant]]
name = "upper-only"
scheduler.low = { policy = "fifo", queue_len = 300 }
"#;

#[test]
fn differentiation_in_the_upper_dif_alone_is_lost_when_the_lower_congests() {
    let both = run(STACK, Some("both"));
    let (h, l) = (class(&both, "hi"), class(&both, "lo"));
    assert!(
        l.avg_ms.unwrap() > 10.0 * h.avg_ms.unwrap(),
        "both differentiate: hi {:?} lo {:?}",
        h.avg_ms,
        l.avg_ms
    );
    assert_eq!(h.loss_pct, 0.0);
    let upper = run(STACK, Some("upper-only"));
    let (h, l) = (class(&upper, "hi"), class(&upper, "lo"));
    let (hd, ld) = (h.avg_ms.unwrap(), l.avg_ms.unwrap());
    assert!(hd > 50.0, "hi waits in the lower FIFO: {hd} ms");
    assert!((hd - ld).abs() < 0.2 * ld, "no difference: {hd} vs {ld}");
    // Two hops in the lower DIF, one in the upper; both DIFs' headers.
    let f = &both.flows[0];
    assert_eq!(f.hops, Some(1));
    assert_eq!(f.dif, "up");
}

/// A triangle: the direct a--b link and a two-hop detour through c. The
/// direct link goes down halfway.
const TRIANGLE: &str = r#"
nodes = ["a", "b", "c"]

[experiment]
name = "triangle"
duration = "4s"
seed = 3

[[link]]
between = ["a", "b"]
delay = "1ms"

[[link]]
between = ["a", "c"]
delay = "1ms"

[[link]]
between = ["c", "b"]
delay = "1ms"

[[dif]]
name = "net"
members = ["*"]
over = ["links"]

[[app]]
name = "server"
node = "b"
dif = "net"

[[traffic]]
kind = "echo"
dif = "net"
from = ["a"]
app = "server"
interval = "10ms"

[[event]]
at = "2s"
action = "link-down"
link = "a--b"

[[event]]
at = "3s"
action = "app-move"
app = "server"
to = "c"
"#;

#[test]
fn a_link_down_is_routed_around_and_a_moved_application_is_reached_at_its_new_place() {
    let out = run(TRIANGLE, None);
    assert_eq!(out.flows.len(), 2, "{:?}", out.flows);
    let (f1, f2) = (&out.flows[0], &out.flows[1]);
    // Before the cut: one hop, RTT 2 ms; after: the detour, RTT 4 ms.
    assert_eq!(f1.served_by.as_deref(), Some("b"));
    assert_eq!(f1.hops, Some(1));
    assert!((f1.delay_min_ms.unwrap() - 1.0).abs() < 0.01);
    assert!((f1.delay_max_ms.unwrap() - 2.0).abs() < 0.01);
    assert!(f1.sent - f1.received <= 1, "{} of {}", f1.received, f1.sent);
    // After the move, the same client reaches the server at c, one hop away.
    assert_eq!(f2.flow, format!("{}#2", f1.flow));
    assert_eq!(f2.served_by.as_deref(), Some("c"));
    assert!(f2.received + 1 >= f2.sent && f2.received > 50);
    assert!((f2.delay_avg_ms.unwrap() - 1.0).abs() < 0.01);
    assert!(out.timeline.iter().any(|t| t.what.contains("a--b down")));
}

fn engine(out: &RunOutput) -> &str {
    let e = out
        .timeline
        .iter()
        .find(|t| t.what.starts_with("engine: "))
        .expect("the timeline names the engine");
    e.what["engine: ".len()..].split(' ').next().unwrap_or("")
}

#[test]
fn the_engine_is_chosen_by_what_the_experiment_needs() {
    // One DIF over links, FIFO, echo: the real protocol machines, with
    // enrollment before the traffic (negative times) and allocations.
    let out = run(TRIANGLE, None);
    assert_eq!(engine(&out), "protocol");
    assert!(out.timeline[0].t_s < 0.0 && out.timeline[0].what.contains("enrolled"));
    assert!(out.flows.iter().all(|f| f.allocation_ms.is_some()));
    // A QoS policy or a stack of DIFs: the protocol engine too.
    assert_eq!(engine(&run(CONGESTED, Some("qta"))), "protocol");
    assert_eq!(engine(&run(STACK, Some("both"))), "protocol");
    // Perf traffic over the triangle's links, which have no rate (the
    // writer would fill them in no time): the queueing approximation,
    // which says why; the protocol engine refuses it by name too.
    let perf = TRIANGLE.replace(
        "[[event]]",
        "[[traffic]]\nkind = \"perf\"\ndif = \"net\"\nfrom = [\"a\"]\nto = \"b\"\nsdu_sizes = [1000]\nper_size = \"1s\"\n\n[[event]]",
    );
    let out = run(&perf, None);
    assert_eq!(engine(&out), "queueing");
    assert!(out.timeline.iter().any(|t| t
        .what
        .contains("because of perf traffic from a node with a link without a rate")));
    let err = run_on(&perf, None, false, Some(Engine::Protocol)).unwrap_err();
    assert!(err.to_string().contains("link without a rate"), "{err}");
    // With a rate on its links, the protocol engine runs it.
    let paced = perf.replace("delay = \"1ms\"", "delay = \"1ms\"\nrate = \"5Mbps\"");
    assert_eq!(engine(&run(&paced, None)), "protocol");
    // Ten times the rate (90 Mb/s) still runs on the stack: the bound is
    // on the work, the bits offered over the run.
    let busy = CONGESTED.replace("rate = \"9Mbps\"", "rate = \"90Mbps\"");
    assert_eq!(engine(&run(&busy, Some("qta"))), "protocol");
    // More than 200 Gbit offered (60 Gb/s for 4 s): the queueing
    // approximation, which says why; asked for by name, the protocol engine.
    let heavy = CONGESTED.replace("rate = \"9Mbps\"", "rate = \"60Gbps\"");
    let exp = load(&heavy, Some("qta")).unwrap();
    let (chosen, why) = Engine::choose(&exp, None).unwrap();
    assert_eq!(chosen, Engine::Queueing);
    assert!(
        why.contains("Gbit of tgen, echo and perf traffic offered over the run"),
        "{why}"
    );
    let (chosen, _) = Engine::choose(&exp, Some(Engine::Protocol)).unwrap();
    assert_eq!(chosen, Engine::Protocol);
}

#[test]
fn the_protocol_engine_is_deterministic_too() {
    let mut a = run_with(TRIANGLE, None, false).unwrap();
    let mut b = run_with(TRIANGLE, None, false).unwrap();
    a.wall_time_s = 0.0;
    b.wall_time_s = 0.0;
    assert_eq!(a, b);
}

#[test]
fn same_seed_gives_the_same_output_and_another_seed_does_not() {
    let mut a = run_with(CONGESTED, Some("qta"), false).unwrap();
    let mut b = run_with(CONGESTED, Some("qta"), false).unwrap();
    a.wall_time_s = 0.0;
    b.wall_time_s = 0.0;
    assert_eq!(a, b);
    let mut c = run_with(
        &CONGESTED.replace("seed = 7", "seed = 8"),
        Some("qta"),
        false,
    )
    .unwrap();
    c.wall_time_s = 0.0;
    assert_ne!(a.flows, c.flows);
}

#[test]
fn a_run_stops_when_asked() {
    let long = CONGESTED.replace("duration = \"4s\"", "duration = \"600s\"");
    assert!(matches!(
        run_with(&long, Some("qta"), true),
        Err(LabError::Interrupted)
    ));
}

#[test]
fn progress_is_reported_as_a_growing_fraction_of_virtual_time() {
    for (text, variant) in [(CONGESTED, Some("qta")), (TRIANGLE, None)] {
        let exp = load(text, variant).unwrap();
        let seen = std::sync::Mutex::new(Vec::<f64>::new());
        let progress = |f: f64, _: &str| seen.lock().unwrap().push(f);
        let stop = AtomicBool::new(false);
        let dir = std::env::temp_dir();
        let ctx = RunCtx {
            dir: &dir,
            progress: &progress,
            stop: &stop,
        };
        Sim::default().run_once(&exp, &ctx).unwrap();
        let v = seen.into_inner().unwrap();
        assert!(v.len() > 2, "{v:?}");
        assert!(v.windows(2).all(|w| w[0] <= w[1]), "{v:?}");
        assert!(v.iter().all(|f| (0.0..=1.0).contains(f)));
        assert_eq!(v.last(), Some(&1.0));
    }
}

#[test]
fn a_link_with_a_tiny_queue_pushes_back_into_the_rmt_instead_of_dropping() {
    // One frame of queue: the shim's 2 ms pacing burst does not fit, so
    // the link pushes frames back (like a full socket buffer) and the
    // system holds the N-1 port; the policy still decides, nothing is lost
    // at the link.
    let tiny = CONGESTED.replace("delay = \"1ms\"", "delay = \"1ms\"\nqueue = 1");
    let out = run_on(&tiny, Some("qta"), false, Some(Engine::Protocol)).unwrap();
    print!("{}", out.summary_table());
    let (u, b) = (class(&out, "urgent"), class(&out, "bulk"));
    assert_eq!(out.links[0].dropped, 0, "the link dropped frames");
    assert_eq!(u.loss_pct, 0.0);
    assert!(b.avg_ms.unwrap() > 10.0 * u.avg_ms.unwrap());
    assert!(
        out.links[0].avg_bps_ab > 9.0e6,
        "{}",
        out.links[0].avg_bps_ab
    );
}

#[test]
fn echo_probes_to_a_node_leave_its_other_traffic_alone() {
    // A 4 Mb/s CBR flow a -> b and echo probes a -> b every 100 ms (seed
    // 003's delay probes). The probes' replies are all b sends back: its
    // receiver of tgen data is not the echo server (one receiver for both
    // wrote the whole 4 Mb/s back, doubling seed 003's HR uplinks).
    let text = r#"
nodes = ["a", "b"]
[experiment]
name = "probe-beside"
duration = "3s"
seed = 1
[[link]]
between = ["a", "b"]
rate = "100Mbps"
delay = "1ms"
[[dif]]
name = "net"
members = ["*"]
over = ["links"]
[[profile]]
name = "cbr-4M"
profile = "cbr"
rate = "4Mbps"
size = 1000
[[traffic]]
kind = "tgen"
dif = "net"
profiles = ["cbr-4M"]
pairs = [["a", "b"]]
[[traffic]]
kind = "echo"
dif = "net"
pairs = [["a", "b"]]
interval = "100ms"
"#;
    let out = run_on(text, None, false, Some(Engine::Protocol)).expect("run succeeds");
    let l = &out.links[0];
    assert!(
        l.avg_bps_ab > 3.9e6,
        "a -> b carries the CBR: {}",
        l.avg_bps_ab
    );
    assert!(
        l.avg_bps_ba < 0.05 * l.avg_bps_ab,
        "b -> a carries {} b/s beside a -> b's {}: the data was echoed",
        l.avg_bps_ba,
        l.avg_bps_ab
    );
    let echo = out.flows.iter().find(|f| f.kind == "echo").unwrap();
    assert!(
        echo.received >= 25,
        "the probes were answered: {}",
        echo.received
    );
    let tgen = out.flows.iter().find(|f| f.kind == "tgen").unwrap();
    assert!(tgen.received >= 1400 && tgen.loss_pct == 0.0);
}

/// Two systems over a 10 Mb/s link; a perf sweep over 300- and 1400-byte
/// SDUs, 2 s each, on the reliable or the unreliable cube.
const PERF: &str = r#"
nodes = ["a", "b"]

[experiment]
name = "perf"
duration = "5s"
seed = 3

[[link]]
between = ["a", "b"]
rate = "10Mbps"
delay = "2ms"

[[dif]]
name = "net"
members = ["a", "b"]
over = ["links"]

[[traffic]]
kind = "perf"
dif = "net"
from = ["a"]
to = "b"
class = "perf"
sdu_sizes = [300, 1400]
per_size = "2s"
cube = "CUBE"
"#;

/// The most a 10 Mb/s link carries of `size`-byte SDUs once the shims
/// pace at PACE_SHARE of it and every SDU pays the DIF's PCI, the
/// shim-udp header and the frame's overhead.
fn perf_ceiling(size: usize) -> f64 {
    use rina_lab::backend::{sim, stack};
    let per_frame = sim::PCI_BYTES + 5 + sim::LINK_OVERHEAD;
    10e6 * stack::PACE_SHARE * size as f64 / (size + per_frame) as f64
}

/// The queueing model times a size's goodput as `rina-perf`'s receiver
/// does, so it stays below what the link carries (it counted the size's
/// SDUs still queued when the next size began: 10.4 Mb/s of 500-byte SDUs
/// over 10 Mb/s) and near the stack's, which paces at PACE_SHARE.
#[test]
fn the_queueing_model_times_perf_goodput_as_the_tool_does() {
    let text = PERF.replace("CUBE", "best-effort");
    let model = run_on(&text, None, false, Some(Engine::Queueing)).unwrap();
    let stack = run(&text, None);
    assert_eq!(model.goodput.len(), 2, "{:?}", model.goodput);
    for (m, s) in model.goodput.iter().zip(&stack.goodput) {
        let top = perf_ceiling(m.sdu_bytes) / rina_lab::backend::stack::PACE_SHARE;
        println!(
            "{} B: model {:.3} Mb/s, stack {:.3}, link at most {:.3}",
            m.sdu_bytes,
            m.goodput_bps / 1e6,
            s.goodput_bps / 1e6,
            top / 1e6
        );
        assert!(m.goodput_bps <= top * 1.005, "{m:?}: > {top}");
        assert!(m.goodput_bps > top * 0.9, "{m:?}: < 90 % of {top}");
        let r = m.goodput_bps / s.goodput_bps;
        assert!((0.95..1.08).contains(&r), "model / stack {r}");
    }
}

/// The queueing model sends a reliable flow's lost PDUs again, as EFCP
/// does: `cc-loss`'s reliable flows over 5 % and 20 % loss lose nothing
/// (the model lost 5.2 % and 20.5 % of them before).
#[test]
fn the_queueing_model_retransmits_for_reliable_cubes() {
    let p = format!(
        "{}/../../examples/lab/cc-loss.toml",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(p).unwrap();
    let out = run_on(&text, None, false, Some(Engine::Queueing)).unwrap();
    print!("{}", out.summary_table());
    assert_eq!(out.flows.len(), 2);
    for f in &out.flows {
        assert!(f.sent > 1000, "{}: {}", f.flow, f.sent);
        assert_eq!(f.received, f.sent, "{}", f.flow);
        assert_eq!(f.loss_pct, 0.0, "{}", f.flow);
    }
    let resent = out
        .timeline
        .iter()
        .find_map(|t| {
            t.what
                .strip_suffix(" PDUs of flows in reliable cubes sent again")
        })
        .and_then(|w| w.strip_prefix("queueing model: "))
        .and_then(|n| n.parse::<u64>().ok())
        .expect("the timeline counts the PDUs sent again");
    let total: u64 = out.flows.iter().map(|f| f.sent).sum();
    // About 5 % of one flow's PDUs and 20 % of the other's went again.
    assert!(
        resent > total / 20 && resent < total / 2,
        "{resent} of {total}"
    );
}

#[test]
fn perf_goodput_on_a_paced_link_is_the_link_rate_less_the_overheads() {
    for cube in ["reliable", "best-effort"] {
        let text = PERF.replace("CUBE", cube);
        let out = run(&text, None);
        assert_eq!(engine(&out), "protocol", "{cube}");
        let f = &out.flows[0];
        assert_eq!(f.kind, "perf");
        assert!(f.error.is_none(), "{cube}: {:?}", f.error);
        assert_eq!(out.goodput.len(), 2, "{cube}: {:?}", out.goodput);
        for g in &out.goodput {
            let top = perf_ceiling(g.sdu_bytes);
            println!(
                "{cube} {} B: {:.3} Mb/s of at most {:.3}",
                g.sdu_bytes,
                g.goodput_bps / 1e6,
                top / 1e6
            );
            // Below what the paced link carries, and close to it.
            assert!(g.goodput_bps <= top * 1.005, "{cube} {g:?}: > {top}");
            assert!(g.goodput_bps > top * 0.85, "{cube} {g:?}: < 85 % of {top}");
        }
        // Larger SDUs pay the per-SDU overheads less often.
        assert!(out.goodput[1].goodput_bps > out.goodput[0].goodput_bps);
        // A reliable flow loses nothing; an unreliable one is held back by
        // its own system's queues, so it loses little.
        if cube == "reliable" {
            assert_eq!(f.received, f.sent, "{f:?}");
        } else {
            assert!(f.loss_pct < 5.0, "{f:?}");
        }
    }
}

/// Two systems over a 10 Mb/s link, a normal DIF over it, and flows
/// directly over the link's shim DIF: echo probes to an application, a
/// CBR tgen flow to the other node and a perf sweep.
const OVER_SHIM: &str = r#"
nodes = ["a", "b"]

[experiment]
name = "over-shim"
duration = "3s"
seed = 5

[[link]]
between = ["a", "b"]
rate = "10Mbps"
delay = "3ms"

[[dif]]
name = "net"
members = ["a", "b"]
over = ["links"]

[[app]]
name = "server"
node = "b"
dif = "net"

[[traffic]]
kind = "echo"
dif = "links"
from = ["a"]
app = "server"
interval = "20ms"

[[profile]]
name = "cbr"
profile = "cbr"
rate = "2Mbps"
size = 1000

[[traffic]]
kind = "tgen"
dif = "links"
profiles = ["cbr"]
pairs = [["a", "b"]]
"#;

#[test]
fn flows_directly_over_a_link_shim_run_on_the_protocol_engine() {
    let out = run(OVER_SHIM, None);
    assert_eq!(engine(&out), "protocol");
    assert_eq!(out.flows.len(), 2, "{:?}", out.flows);
    for f in &out.flows {
        assert_eq!(f.dif, "a--b", "{f:?}");
        assert_eq!(f.served_by.as_deref(), Some("b"), "{f:?}");
        assert_eq!(f.hops, Some(1));
        assert!(f.error.is_none() && f.allocation_ms.is_some(), "{f:?}");
        assert!(f.sent > 100 && f.received == f.sent, "{f:?}");
    }
    // The probes' delay is the link's: 3 ms and a 1,000-byte frame's time
    // at most (no normal DIF, no queue of its own at 2 Mb/s of 10).
    let echo = out.flows.iter().find(|f| f.kind == "echo").unwrap();
    let d = echo.delay_avg_ms.unwrap();
    assert!((3.0..3.5).contains(&d), "{d}");
    // Nothing of it crossed the normal DIF: the link carried what the
    // flows wrote, and the normal DIF's members only their hellos.
    let l = &out.links[0];
    assert!(l.avg_bps_ab > 2e6 && l.avg_bps_ab < 2.5e6, "{l:?}");
}

/// A perf sweep straight over a 10 Mb/s link's shim, eight sizes of 1 s:
/// longer than the 6 s a test waits for its REPORT, while the writer
/// keeps the link's queue full.
const SWEEP_OVER_SHIM: &str = r#"
nodes = ["a", "b"]

[experiment]
name = "sweep-over-shim"
duration = "10s"

[[link]]
between = ["a", "b"]
rate = "10Mbps"
delay = "100us"

[[dif]]
name = "net"
members = ["a", "b"]
over = ["links"]

[[traffic]]
kind = "perf"
dif = "links"
from = ["a"]
to = "b"
class = "sweep"
sdu_sizes = [100, 200, 300, 400, 500, 600, 700, 800]
per_size = "1s"
"#;

/// Every size of the sweep gets its REPORT: a test's STOPs no longer queue
/// behind the next size's DATA at a full link (the first size's were lost
/// there, every one for 6 s, and its result with them).
#[test]
fn a_perf_sweep_over_a_full_link_gets_every_report() {
    let out = run(SWEEP_OVER_SHIM, None);
    assert_eq!(engine(&out), "protocol");
    let f = &out.flows[0];
    assert!(f.error.is_none(), "{:?}", f.error);
    let sizes: Vec<usize> = out.goodput.iter().map(|g| g.sdu_bytes).collect();
    assert_eq!(sizes, [100, 200, 300, 400, 500, 600, 700, 800]);
    for g in &out.goodput {
        assert!(g.goodput_bps > 5e6, "{g:?}");
    }
}

/// 10 Mb/s links a-b-d (the short way) and a-c-e-d (the long way), one
/// DIF: echo probes from a and from b to a server at d. Node b stops at
/// 2 s and starts at 5 s.
const NODE_STOP: &str = r#"
nodes = ["a", "b", "c", "d", "e"]

[experiment]
name = "node-stop"
duration = "10s"
seed = 11

[[link]]
between = ["a", "b"]
rate = "10Mbps"
delay = "1ms"

[[link]]
between = ["b", "d"]
rate = "10Mbps"
delay = "1ms"

[[link]]
between = ["a", "c"]
rate = "10Mbps"
delay = "1ms"

[[link]]
between = ["c", "e"]
rate = "10Mbps"
delay = "1ms"

[[link]]
between = ["e", "d"]
rate = "10Mbps"
delay = "1ms"

[[dif]]
name = "net"
members = ["*"]
over = ["links"]

[[app]]
name = "server"
node = "d"
dif = "net"

[[traffic]]
kind = "echo"
dif = "net"
from = ["a", "b"]
app = "server"
interval = "20ms"

[[event]]
at = "2s"
action = "node-stop"
node = "b"

[[event]]
at = "5s"
action = "node-start"
node = "b"
"#;

#[test]
fn a_stopped_node_is_routed_around_and_comes_back_when_it_starts() {
    let out = run(NODE_STOP, None);
    assert_eq!(engine(&out), "protocol");
    let rec = |id: &str| {
        out.flows
            .iter()
            .find(|f| f.flow.starts_with(id))
            .unwrap_or_else(|| panic!("no flow {id}: {:?}", out.flows))
    };
    // a's probes went through b (two hops of 1 ms: ~2.2 ms of RTT / 2);
    // once b's neighbours found it silent (the dead interval: the probes
    // meanwhile are lost), the long way through c and e (~3.3 ms): the
    // same flow, rerouted, and never allocated again.
    let a = rec("t0.echo.a>");
    assert!(!out
        .flows
        .iter()
        .any(|f| f.flow.starts_with("t0.echo.a>") && f.flow.contains('#')));
    assert!(a.delay_min_ms.unwrap() < 2.5, "{a:?}");
    assert!(a.delay_max_ms.unwrap() > 3.0, "{a:?}");
    assert!(a.received < a.sent && a.received > a.sent / 2, "{a:?}");
    // b's own flow ended with it; once it started again and enrolled, its
    // client allocated again and was served by d.
    let b: Vec<_> = out
        .flows
        .iter()
        .filter(|f| f.flow.contains(".b>"))
        .collect();
    assert_eq!(b.len(), 2, "{b:?}");
    assert!(b[0].sent <= 101 && b[0].received <= b[0].sent, "{:?}", b[0]);
    assert!(b[1].flow.ends_with("#2"), "{:?}", b[1]);
    assert_eq!(b[1].served_by.as_deref(), Some("d"));
    assert!(b[1].received > 100, "{:?}", b[1]);
    assert!(out.timeline.iter().any(|t| t.what == "node b stops"));
    let again = out
        .timeline
        .iter()
        .find(|t| t.what.starts_with(&format!("{}: allocated", b[1].flow)))
        .expect("the second allocation is in the timeline");
    assert!(again.t_s > 5.0, "{again:?}");
}
