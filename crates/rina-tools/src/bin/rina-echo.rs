//! `rina-echo`: an echo server and a ping-like client over RINA flows.
//!
//! Exit codes: 0 on success; 1 if the client received no reply at all;
//! 2 on any error (daemon not running, allocation refused, ...).

use clap::{Args, Parser, Subcommand};
use rina::{AppName, Client, Flow};
use rina_tools::echo::{self, EchoReport};
use rina_tools::opts::{self, CommonArgs, QosArgs};
use rina_tools::serving;
use rina_tools::stats::Summary;
use std::io::Write;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

const TOOL: &str = "rina-echo";

/// Echo server and ping-like client over RINA flows.
#[derive(Debug, Parser)]
#[command(name = "rina-echo", version)]
struct Cli {
    #[command(subcommand)]
    mode: Mode,
}

// Parsed once; the size difference does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
enum Mode {
    /// Register a name, accept every flow and echo every SDU back.
    Server(ServerArgs),
    /// Send probes to an echo server and report round-trip times.
    Client(ClientArgs),
}

#[derive(Debug, Args)]
struct ServerArgs {
    #[command(flatten)]
    common: CommonArgs,
    /// Application name to register.
    #[arg(long, default_value = "echo", value_parser = opts::parse_name)]
    name: AppName,
    /// Accept this many flows (at least 1), then exit once they are all
    /// closed.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    max_flows: Option<u64>,
    /// Take flows whose client asks for a direct path (shim-udp) on a UDP
    /// socket of this server's own, without the daemons on the data path.
    #[arg(long)]
    direct: bool,
    /// Have the daemon accept every flow request for the name itself, so
    /// that an allocation waits for no round trip to this server (compare
    /// the client's allocation time with and without). Flows accepted but
    /// not taken when the server exits are closed.
    #[arg(long)]
    daemon_accepts: bool,
}

#[derive(Debug, Args)]
struct ClientArgs {
    #[command(flatten)]
    common: CommonArgs,
    #[command(flatten)]
    qos: QosArgs,
    /// Name of the echo server.
    #[arg(long, default_value = "echo", value_parser = opts::parse_name)]
    dst: AppName,
    /// This client's application name.
    #[arg(long, default_value = "echo-client", value_parser = opts::parse_name)]
    name: AppName,
    /// Number of probes (at least 1).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    count: u64,
    /// Time between probes, in milliseconds.
    #[arg(long, default_value_t = 200)]
    interval_ms: u64,
    /// Probe size in bytes (at least 16: a probe's sequence number and
    /// time).
    #[arg(long, default_value_t = 64, value_parser = probe_size)]
    size: usize,
    /// How long a reply may take, in milliseconds; a reply after that is
    /// late and the probe counts as lost. Probes keep leaving every
    /// --interval-ms meanwhile (at least 1).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
    timeout_ms: u64,
    /// Print one JSON object (summary and every RTT in µs) instead of text.
    #[arg(long)]
    json: bool,
    /// Ask for a direct path (shim-udp, if the server takes one too): the
    /// probes go between the two applications' UDP sockets, not through
    /// the daemons.
    #[arg(long)]
    direct: bool,
    /// After each probe, poll the flow for a reply this long before
    /// sleeping, in microseconds (yielding the core between polls): no
    /// wake-up for a reply that comes within it, at the cost of the CPU
    /// spent polling. 0 (the default) sleeps at once.
    #[arg(long, default_value_t = 0)]
    busy_poll_us: u64,
}

fn main() {
    rina_tools::opts::quiet_on_closed_stdout();
    rina_docgen::handle::<Cli>();
    match Cli::parse().mode {
        Mode::Server(a) => server(a),
        Mode::Client(a) => {
            let code = client(a);
            std::process::exit(code)
        }
    }
}

fn server(a: ServerArgs) {
    let mut c = a
        .common
        .connect()
        .unwrap_or_else(|e| opts::die(TOOL, "cannot connect", &e, 2));
    c.set_direct(a.direct);
    serving::register(TOOL, &mut c, &a.name, a.common.dif(), a.daemon_accepts);
    flush();
    let mut workers = Vec::new();
    let mut accepted = 0u64;
    while !matches!(a.max_flows, Some(m) if accepted >= m) {
        let Some(flow) = serving::next_flow(TOOL, &mut c, a.daemon_accepts) else {
            continue;
        };
        accepted += 1;
        println!(
            "accepted flow {} from {} (max SDU {} bytes{})",
            flow.info().port,
            flow.info().remote,
            flow.info().max_sdu,
            if flow.is_direct() { ", direct" } else { "" }
        );
        flush();
        workers.push(thread::spawn(move || echo_flow(flow)));
        workers.retain(|w| !w.is_finished());
    }
    for w in workers {
        let _ = w.join();
    }
}

fn echo_flow(flow: Flow) {
    let port = flow.info().port;
    let served = echo::serve_flow(&flow, |e| eprintln!("{TOOL}: flow {port}: {e}"));
    if let Some(e) = &served.error {
        eprintln!("{TOOL}: flow {port}: {e}; giving up on this flow");
    }
    println!(
        "flow {port} from {} {} after {} SDUs, {} bytes",
        flow.info().remote,
        if served.error.is_some() {
            "failed"
        } else {
            "closed"
        },
        served.sdus,
        served.bytes
    );
    flush();
}

/// A `--size`: at least a probe's header.
fn probe_size(v: &str) -> Result<usize, String> {
    let n: usize = v.parse().map_err(|e| format!("{e}"))?;
    if n < echo::PROBE_HEADER {
        return Err(format!(
            "a probe is at least {} bytes (its sequence number and time)",
            echo::PROBE_HEADER
        ));
    }
    Ok(n)
}

/// Runs the client: sends the probes, prints what came back; returns the exit code.
fn client(a: ClientArgs) -> i32 {
    if let Err(e) = a.qos.check_max_sdu(a.size, "probes") {
        opts::die(TOOL, "bad --max-sdu", &e, 2);
    }
    let mut c: Client = match a.common.connect() {
        Ok(c) => c,
        Err(e) => opts::die(TOOL, "cannot connect", &e, 2),
    };
    let size = a.size;
    c.set_direct(a.direct);
    let (flow, allocation_ms) = open_flow(&a, &mut c, size);
    opts::note_if_not_direct(TOOL, a.direct, &flow);
    flow.set_busy_poll((a.busy_poll_us > 0).then(|| Duration::from_micros(a.busy_poll_us)));
    let tally = send_probes(&a, &flow, size);
    let mut report = echo_report(&a, &flow, size, tally);
    report.allocation_ms = Some(allocation_ms);
    print_report(&a, &report);
    if report.received == 0 {
        1
    } else {
        0
    }
}

/// Allocates the flow to the server, checks it takes `size`-byte probes and
/// says so (unless `--json`); the flow, and how long its allocation took
/// in milliseconds.
fn open_flow(a: &ClientArgs, c: &mut Client, size: usize) -> (Arc<Flow>, f64) {
    let asked = Instant::now();
    let flow = match c.allocate(&a.name, &a.dst, a.common.dif(), &a.qos.spec()) {
        Ok(f) => Arc::new(f),
        Err(e) => opts::die(TOOL, &format!("cannot allocate a flow to {}", a.dst), &e, 2),
    };
    let allocation_ms = asked.elapsed().as_secs_f64() * 1e3;
    if size > flow.max_sdu() {
        opts::die(
            TOOL,
            "bad --size",
            &format!(
                "probes of {size} bytes exceed the flow's maximum SDU of {} bytes",
                flow.max_sdu()
            ),
            2,
        );
    }
    if !a.json {
        println!(
            "ECHO {} via {} (flow {}{}): {size}-byte probes",
            a.dst,
            flow.info().dif,
            flow.info().port,
            if flow.is_direct() { ", direct" } else { "" }
        );
    }
    (flow, allocation_ms)
}

/// What the probes brought back.
#[derive(Default)]
struct Tally {
    /// Probes sent.
    sent: u64,
    /// (seq, RTT in µs) of every reply in time, in arrival order.
    rtts_us: Vec<(u64, f64)>,
    /// Replies that came after the timeout.
    late: u64,
    /// SDUs received that were no echo of a probe.
    foreign: u64,
}

/// Sends `a.count` probes on schedule and matches the replies as they come,
/// until every probe got its reply or timed out.
fn send_probes(a: &ClientArgs, flow: &Flow, size: usize) -> Tally {
    let interval = Duration::from_millis(a.interval_ms);
    let timeout = Duration::from_millis(a.timeout_ms);
    let mut buf = vec![0u8; flow.max_sdu().max(size)];
    // Probes leave on schedule whatever the replies do; replies are matched
    // to their probe by number as they come.
    let mut probes = echo::Probes::new(timeout);
    let mut tally = Tally::default();
    let start = echo::mono_ns();
    loop {
        let now = echo::mono_ns();
        for seq in probes.expire(now) {
            if !a.json {
                println!(
                    "no reply from {}: seq={seq} within {} ms",
                    a.dst, a.timeout_ms
                );
            }
        }
        let next_send = (tally.sent < a.count).then(|| echo::due_ns(start, interval, tally.sent));
        if next_send.is_some_and(|due| due <= now) {
            let probe = echo::encode_probe(tally.sent, now, size);
            match flow.write(&probe) {
                Ok(_) => {}
                // Whichever side notices first, a closed flow reads the same.
                Err(e) if e.is_closed() => opts::die(TOOL, "flow closed", &e, 2),
                Err(e) => opts::die(TOOL, "cannot send a probe", &e, 2),
            }
            probes.sent(tally.sent, now);
            tally.sent += 1;
            continue;
        }
        // Wait for a reply until the next probe is due or one expires.
        let wake = match (next_send, probes.next_expiry()) {
            (None, None) => break,
            (Some(a), Some(b)) => a.min(b.saturating_add(1)),
            (Some(a), None) => a,
            (None, Some(b)) => b.saturating_add(1),
        };
        let left = Duration::from_nanos(wake.saturating_sub(now));
        let n = match flow.read_timeout(&mut buf, left) {
            Ok(Some(n)) => n,
            Ok(None) => continue,
            Err(e) if e.is_closed() => opts::die(TOOL, "flow closed", &e, 2),
            Err(e) if opts::is_transient(&e) => {
                eprintln!("{TOOL}: {e}");
                continue;
            }
            Err(e) => opts::die(TOOL, "cannot receive a reply", &e, 2),
        };
        let now = echo::mono_ns();
        let Some((seq, _)) = echo::decode_probe(&buf[..n]) else {
            tally.foreign += 1;
            continue;
        };
        note_reply(a, &mut probes, &mut tally, seq, n, now);
        flush();
    }
    tally
}

/// Matches the `n`-byte reply to probe `seq`, received at `now`, and says
/// what it was (unless `--json`).
fn note_reply(
    a: &ClientArgs,
    probes: &mut echo::Probes,
    tally: &mut Tally,
    seq: u64,
    n: usize,
    now: u64,
) {
    match probes.on_reply(seq, now) {
        echo::ReplyOutcome::InTime(rtt_ns) => {
            let rtt_us = rtt_ns as f64 / 1e3;
            tally.rtts_us.push((seq, rtt_us));
            if !a.json {
                println!(
                    "{n} bytes from {}: seq={seq} rtt={:.3} ms",
                    a.dst,
                    rtt_us / 1e3
                );
            }
        }
        echo::ReplyOutcome::Late(rtt_ns) => {
            tally.late += 1;
            if !a.json {
                println!(
                    "late reply from {}: seq={seq} after {:.3} ms (counted as lost)",
                    a.dst,
                    rtt_ns as f64 / 1e6
                );
            }
        }
        echo::ReplyOutcome::Unexpected => {
            if !a.json {
                println!("unexpected reply from {}: seq={seq} (ignored)", a.dst);
            }
        }
    }
}

/// The summary of the run: counts, loss and RTTs in probe order.
fn echo_report(a: &ClientArgs, flow: &Flow, size: usize, tally: Tally) -> EchoReport {
    let Tally {
        sent,
        mut rtts_us,
        late,
        foreign,
    } = tally;
    if foreign > 0 {
        eprintln!(
            "{TOOL}: {foreign} SDUs from {} were no echo of a probe: is it a rina-echo server? \
             (--dst names the server)",
            a.dst
        );
    } else if rtts_us.is_empty() && late == 0 && sent > 0 {
        eprintln!(
            "{TOOL}: no reply came from {}: either the path lost every probe, or it is no \
             rina-echo server (a rina-perf or rina-tgen server takes probes without answering; \
             --dst names the server)",
            a.dst
        );
    }
    rtts_us.sort_by_key(|&(seq, _)| seq);
    let rtts_us: Vec<f64> = rtts_us.into_iter().map(|(_, r)| r).collect();
    let received = rtts_us.len() as u64;
    EchoReport {
        dst: a.dst.to_string(),
        dif: flow.info().dif.clone(),
        port: flow.info().port,
        size,
        sent,
        received,
        lost: sent - received,
        late,
        loss_pct: echo::loss_pct(sent, received),
        rtt_ms: Summary::of(&rtts_us).map(|s| s.scaled(1e-3)),
        rtt_us: rtts_us,
        allocation_ms: None,
    }
}

/// Prints the report: one JSON object with `--json`, else ping-like statistics.
fn print_report(a: &ClientArgs, report: &EchoReport) {
    if a.json {
        match serde_json::to_string(report) {
            Ok(s) => println!("{s}"),
            Err(e) => opts::die(TOOL, "cannot encode JSON", &e, 2),
        }
    } else {
        println!("--- rina-echo {} statistics ---", a.dst);
        println!(
            "{} probes sent, {} received, {:.1}% loss ({} late replies)",
            report.sent, report.received, report.loss_pct, report.late
        );
        if let Some(s) = report.rtt_ms {
            println!(
                "rtt min/avg/max/mdev = {:.3}/{:.3}/{:.3}/{:.3} ms",
                s.min, s.avg, s.max, s.mdev
            );
            println!(
                "rtt p50/p90/p99 = {:.3}/{:.3}/{:.3} ms",
                s.p50, s.p90, s.p99
            );
        }
    }
}

fn flush() {
    let _ = std::io::stdout().flush();
}
