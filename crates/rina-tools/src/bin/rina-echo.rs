//! `rina-echo`: an echo server and a ping-like client over RINA flows.
//!
//! Exit codes: 0 on success; 1 if the client received no reply at all;
//! 2 on any error (daemon not running, allocation refused, ...).

use clap::{Args, Parser, Subcommand};
use rina::{AppName, Client, Flow};
use rina_tools::echo::{self, EchoReport};
use rina_tools::opts::{self, CommonArgs, QosArgs};
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
    /// Accept this many flows, then exit once they are all closed.
    #[arg(long, value_name = "N")]
    max_flows: Option<u64>,
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
    /// Number of probes.
    #[arg(long, default_value_t = 10)]
    count: u64,
    /// Time between probes, in milliseconds.
    #[arg(long, default_value_t = 200)]
    interval_ms: u64,
    /// Probe size in bytes (at least 16).
    #[arg(long, default_value_t = 64)]
    size: usize,
    /// How long to wait for each reply, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    timeout_ms: u64,
    /// Print one JSON object (summary and every RTT in µs) instead of text.
    #[arg(long)]
    json: bool,
}

fn main() {
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
    let difs = c
        .register(&a.name, a.common.dif())
        .unwrap_or_else(|e| opts::die(TOOL, &format!("cannot register {}", a.name), &e, 2));
    println!("registered {} in {}", a.name, difs.join(", "));
    flush();
    let mut workers = Vec::new();
    let mut accepted = 0u64;
    while !matches!(a.max_flows, Some(m) if accepted >= m) {
        let req = match c.next_request() {
            Ok(r) => r,
            Err(e) => opts::die(TOOL, "lost the daemon", &e, 2),
        };
        println!(
            "flow request from {} to {} in {} (handle {})",
            req.remote, req.local, req.dif, req.handle
        );
        let flow = match c.accept(&req) {
            Ok(f) => f,
            Err(e) => {
                eprintln!("{TOOL}: cannot accept flow from {}: {e}", req.remote);
                if e.is_closed() {
                    std::process::exit(2);
                }
                continue;
            }
        };
        accepted += 1;
        println!(
            "accepted flow {} from {} (max SDU {} bytes)",
            flow.info().port,
            flow.info().remote,
            flow.info().max_sdu
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
    let mut buf = vec![0u8; flow.max_sdu().max(1)];
    let (mut sdus, mut bytes) = (0u64, 0u64);
    loop {
        match flow.read(&mut buf) {
            Ok(n) => {
                if let Err(e) = flow.write(&buf[..n]) {
                    if e.is_closed() {
                        break;
                    }
                    eprintln!("{TOOL}: flow {}: cannot echo: {e}", flow.info().port);
                    continue;
                }
                sdus += 1;
                bytes += n as u64;
            }
            Err(e) if e.is_closed() => break,
            Err(e) => eprintln!("{TOOL}: flow {}: {e}", flow.info().port),
        }
    }
    println!(
        "flow {} from {} closed after {sdus} SDUs, {bytes} bytes",
        flow.info().port,
        flow.info().remote
    );
    flush();
}

fn client(a: ClientArgs) -> i32 {
    let mut c: Client = match a.common.connect() {
        Ok(c) => c,
        Err(e) => opts::die(TOOL, "cannot connect", &e, 2),
    };
    let size = a.size.max(echo::PROBE_HEADER);
    let flow = match c.allocate(&a.name, &a.dst, a.common.dif(), &a.qos.spec()) {
        Ok(f) => Arc::new(f),
        Err(e) => opts::die(TOOL, &format!("cannot allocate a flow to {}", a.dst), &e, 2),
    };
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
            "ECHO {} via {} (flow {}): {size}-byte probes",
            a.dst,
            flow.info().dif,
            flow.info().port
        );
    }
    let interval = Duration::from_millis(a.interval_ms);
    let timeout = Duration::from_millis(a.timeout_ms);
    let mut buf = vec![0u8; flow.max_sdu().max(size)];
    let mut rtts_us = Vec::new();
    let start = Instant::now();
    let mut sent = 0u64;
    for seq in 0..a.count {
        let due = start + interval * u32::try_from(seq).unwrap_or(u32::MAX);
        if let Some(d) = due.checked_duration_since(Instant::now()) {
            thread::sleep(d);
        }
        let probe = echo::encode_probe(seq, echo::mono_ns(), size);
        if let Err(e) = flow.write(&probe) {
            opts::die(TOOL, "cannot send a probe", &e, 2);
        }
        sent += 1;
        let deadline = Instant::now() + timeout;
        let mut got = false;
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            let n = match flow.read_timeout(&mut buf, left) {
                Ok(Some(n)) => n,
                Ok(None) => break,
                Err(e) if e.is_closed() => opts::die(TOOL, "flow closed", &e, 2),
                Err(e) => {
                    eprintln!("{TOOL}: {e}");
                    continue;
                }
            };
            let now = echo::mono_ns();
            match echo::decode_probe(&buf[..n]) {
                Some((s, t)) if s == seq => {
                    let rtt_us = now.saturating_sub(t) as f64 / 1e3;
                    rtts_us.push(rtt_us);
                    if !a.json {
                        println!(
                            "{n} bytes from {}: seq={seq} rtt={:.3} ms",
                            a.dst,
                            rtt_us / 1e3
                        );
                    }
                    got = true;
                    break;
                }
                Some((s, _)) if !a.json => {
                    println!("late reply from {}: seq={s} (ignored)", a.dst)
                }
                _ => {}
            }
        }
        if !got && !a.json {
            println!(
                "no reply from {}: seq={seq} within {} ms",
                a.dst, a.timeout_ms
            );
        }
        flush();
    }
    let received = rtts_us.len() as u64;
    let report = EchoReport {
        dst: a.dst.to_string(),
        dif: flow.info().dif.clone(),
        port: flow.info().port,
        size,
        sent,
        received,
        lost: sent - received,
        loss_pct: echo::loss_pct(sent, received),
        rtt_ms: Summary::of(&rtts_us).map(|s| s.scaled(1e-3)),
        rtt_us: rtts_us,
    };
    if a.json {
        match serde_json::to_string(&report) {
            Ok(s) => println!("{s}"),
            Err(e) => opts::die(TOOL, "cannot encode JSON", &e, 2),
        }
    } else {
        println!("--- rina-echo {} statistics ---", a.dst);
        println!(
            "{} probes sent, {} received, {:.1}% loss",
            report.sent, report.received, report.loss_pct
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
    if received == 0 {
        1
    } else {
        0
    }
}

fn flush() {
    let _ = std::io::stdout().flush();
}
