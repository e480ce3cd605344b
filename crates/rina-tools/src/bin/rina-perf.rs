//! `rina-perf`: goodput and loss of RINA flows.
//!
//! The in-band protocol is described in [`rina_tools::perf`]. With `--sweep`,
//! every size is tested in turn on the same flow.
//!
//! Exit codes: 0 on success; 1 if a test got no REPORT or nothing arrived;
//! 2 on any other error (daemon not running, allocation refused, bad options).

use clap::{Args, Parser, Subcommand};
use rina::{AppName, Flow};
use rina_tools::opts::{self, CommonArgs, QosArgs};
use rina_tools::perf::{self, Msg, Pacer, PerfReport, Report, TestResult};
use rina_tools::table::Table;
use std::io::Write;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const TOOL: &str = "rina-perf";

/// Goodput and loss of RINA flows.
#[derive(Debug, Parser)]
#[command(name = "rina-perf", version)]
struct Cli {
    #[command(subcommand)]
    mode: Mode,
}

// Parsed once; the size difference does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
enum Mode {
    /// Register a name, accept every flow and answer perf tests on it.
    Server(ServerArgs),
    /// Run perf tests against a server.
    Client(ClientArgs),
}

#[derive(Debug, Args)]
struct ServerArgs {
    #[command(flatten)]
    common: CommonArgs,
    /// Application name to register.
    #[arg(long, default_value = "perf", value_parser = opts::parse_name)]
    name: AppName,
    /// Accept this many flows, then exit once they are all closed.
    #[arg(long, value_name = "N")]
    max_flows: Option<u64>,
    /// Do not ask for shared-memory rings (the socket carries every SDU).
    #[arg(long)]
    no_rings: bool,
}

#[derive(Debug, Args)]
struct ClientArgs {
    #[command(flatten)]
    common: CommonArgs,
    #[command(flatten)]
    qos: QosArgs,
    /// Name of the perf server.
    #[arg(long, default_value = "perf", value_parser = opts::parse_name)]
    dst: AppName,
    /// This client's application name.
    #[arg(long, default_value = "perf-client", value_parser = opts::parse_name)]
    name: AppName,
    /// DATA SDU size in bytes (at least 17).
    #[arg(long, default_value_t = 1400)]
    size: usize,
    /// Length of each test, in seconds.
    #[arg(long, default_value_t = 5.0, conflicts_with = "count")]
    duration_s: f64,
    /// Send this many DATA SDUs per test instead of running for a duration.
    #[arg(long, value_name = "N")]
    count: Option<u64>,
    /// Pace the sender to this rate, in Mb/s (10^6 bit/s).
    #[arg(long, value_name = "R")]
    rate_mbps: Option<f64>,
    /// Run one test per size, on the same flow (e.g. 64,256,1024,1400).
    #[arg(long, value_delimiter = ',', value_name = "SIZES")]
    sweep: Option<Vec<usize>>,
    /// Print one JSON object.
    #[arg(long, conflicts_with = "csv")]
    json: bool,
    /// Print CSV rows: size,sent_sdus,recv_sdus,loss_pct,tx_mbps,rx_mbps,rx_sdus_per_s.
    #[arg(long)]
    csv: bool,
    /// Do not ask for shared-memory rings where the DIF offers them
    /// (shim-hv, normal DIFs): the flow's socket then carries every SDU.
    #[arg(long)]
    no_rings: bool,
}

fn main() {
    match Cli::parse().mode {
        Mode::Server(a) => server(a),
        Mode::Client(a) => std::process::exit(client(a)),
    }
}

fn server(a: ServerArgs) {
    let mut c = a
        .common
        .connect()
        .unwrap_or_else(|e| opts::die(TOOL, "cannot connect", &e, 2));
    c.set_rings(!a.no_rings);
    let difs = c
        .register(&a.name, a.common.dif())
        .unwrap_or_else(|e| opts::die(TOOL, &format!("cannot register {}", a.name), &e, 2));
    println!("registered {} in {}", a.name, difs.join(", "));
    flush();
    let mut workers = Vec::new();
    let mut accepted = 0u64;
    while !matches!(a.max_flows, Some(m) if accepted >= m) {
        let req = c
            .next_request()
            .unwrap_or_else(|e| opts::die(TOOL, "lost the daemon", &e, 2));
        println!(
            "flow request from {} to {} in {}",
            req.remote, req.local, req.dif
        );
        match c.accept(&req) {
            Ok(flow) => {
                accepted += 1;
                println!("accepted flow {} from {}", flow.info().port, req.remote);
                workers.push(thread::spawn(move || serve_flow(flow)));
                workers.retain(|w| !w.is_finished());
            }
            Err(e) if e.is_closed() => opts::die(TOOL, "lost the daemon", &e, 2),
            Err(e) => eprintln!("{TOOL}: cannot accept flow from {}: {e}", req.remote),
        }
        flush();
    }
    for w in workers {
        let _ = w.join();
    }
}

fn serve_flow(flow: Flow) {
    let port = flow.info().port;
    let served = perf::serve_flow(
        &flow,
        |r| {
            println!(
                "flow {port}: test {:08x}: {} SDUs, {} bytes in {:.3} s",
                r.test,
                r.recv_sdus,
                r.recv_bytes,
                r.duration_ns as f64 / 1e9
            );
            flush();
        },
        |e| eprintln!("{TOOL}: flow {port}: {e}"),
    );
    match served.error {
        Some(e) => eprintln!("{TOOL}: flow {port}: {e}; giving up on this flow"),
        None => println!("flow {port} closed"),
    }
    flush();
}

fn client(a: ClientArgs) -> i32 {
    let sizes = a.sweep.clone().unwrap_or_else(|| vec![a.size]);
    if sizes.is_empty() {
        opts::die(TOOL, "bad --sweep", &"no size given", 2);
    }
    if let Some(s) = sizes.iter().find(|&&s| s < perf::DATA_HEADER) {
        opts::die(
            TOOL,
            "bad size",
            &format!(
                "{s} bytes is less than the {}-byte DATA header",
                perf::DATA_HEADER
            ),
            2,
        );
    }
    if !(a.duration_s.is_finite() && a.duration_s > 0.0) && a.count.is_none() {
        opts::die(
            TOOL,
            "bad --duration-s",
            &"must be a positive number of seconds",
            2,
        );
    }
    let mut c = a
        .common
        .connect()
        .unwrap_or_else(|e| opts::die(TOOL, "cannot connect", &e, 2));
    c.set_rings(!a.no_rings);
    let flow = c
        .allocate(&a.name, &a.dst, a.common.dif(), &a.qos.spec())
        .unwrap_or_else(|e| {
            opts::die(TOOL, &format!("cannot allocate a flow to {}", a.dst), &e, 2)
        });
    if let Some(s) = sizes.iter().find(|&&s| s > flow.max_sdu()) {
        opts::die(
            TOOL,
            "bad size",
            &format!(
                "{s} bytes exceeds the flow's maximum SDU of {} bytes",
                flow.max_sdu()
            ),
            2,
        );
    }
    let human = !a.json && !a.csv;
    if human {
        println!(
            "PERF {} via {} (flow {}, max SDU {} bytes)",
            a.dst,
            flow.info().dif,
            flow.info().port,
            flow.info().max_sdu
        );
        flush();
    }
    let base = test_id_base();
    let mut results = Vec::new();
    let mut code = 0;
    for (i, &size) in sizes.iter().enumerate() {
        let test = base.wrapping_add(i as u32);
        match run_test(&flow, &a, test, size) {
            Ok(r) => {
                if r.report.recv_sdus == 0 {
                    code = 1;
                }
                if human {
                    println!(
                        "size {size}: sent {} SDUs ({:.2} Mb/s), received {} ({:.2} Mb/s, {:.0} SDU/s), loss {:.2}%",
                        r.sent_sdus, r.tx_mbps, r.report.recv_sdus, r.rx_mbps, r.rx_sdus_per_s, r.loss_pct
                    );
                    flush();
                }
                results.push(r);
            }
            Err(e) => {
                eprintln!("{TOOL}: size {size}: {e}");
                code = 1;
            }
        }
    }
    let report = PerfReport {
        dst: a.dst.to_string(),
        dif: flow.info().dif.clone(),
        port: flow.info().port,
        tests: results,
    };
    if a.json {
        match serde_json::to_string(&report) {
            Ok(s) => println!("{s}"),
            Err(e) => opts::die(TOOL, "cannot encode JSON", &e, 2),
        }
    } else if a.csv {
        println!("{}", TestResult::CSV_HEADER);
        for r in &report.tests {
            println!("{}", r.csv_row());
        }
    } else {
        print!("{}", results_table(&report.tests).render());
    }
    code
}

/// The human-readable table of test results.
fn results_table(tests: &[TestResult]) -> Table {
    let mut t = Table::new(&[
        "SIZE", "SENT", "RECV", "LOSS%", "TX_Mb/s", "TX_SDU/s", "RX_Mb/s", "RX_SDU/s", "DUP",
        "REORD",
    ])
    .numeric(&[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
    for r in tests {
        t.row(vec![
            r.size.to_string(),
            r.sent_sdus.to_string(),
            r.report.recv_sdus.to_string(),
            format!("{:.2}", r.loss_pct),
            format!("{:.2}", r.tx_mbps),
            format!("{:.0}", r.tx_sdus_per_s),
            format!("{:.2}", r.rx_mbps),
            format!("{:.0}", r.rx_sdus_per_s),
            r.report.duplicates.to_string(),
            r.report.out_of_order.to_string(),
        ]);
    }
    t
}

/// A test id unlikely to collide with another client's.
fn test_id_base() -> u32 {
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos() ^ (d.as_secs() as u32))
        .unwrap_or(0);
    t ^ std::process::id().wrapping_mul(2_654_435_761)
}

fn run_test(flow: &Flow, a: &ClientArgs, test: u32, size: usize) -> Result<TestResult, String> {
    let err = |e: rina::Error| e.to_string();
    flow.write(
        &Msg::Start {
            test,
            size: size as u32,
        }
        .encode(),
    )
    .map_err(err)?;
    let mut buf = vec![0u8; size];
    let mut pacer = a.rate_mbps.and_then(Pacer::new);
    let duration = Duration::from_secs_f64(if a.duration_s.is_finite() {
        a.duration_s.clamp(0.0, 1e9)
    } else {
        0.0
    });
    let start = Instant::now();
    let (mut sent, mut bytes) = (0u64, 0u64);
    loop {
        match a.count {
            Some(n) if sent >= n => break,
            None if start.elapsed() >= duration => break,
            _ => {}
        }
        if let Some(p) = pacer.as_mut() {
            p.wait(size);
        }
        perf::write_data_header(&mut buf, test, sent);
        flow.write(&buf).map_err(err)?;
        sent += 1;
        bytes += size as u64;
    }
    let send_time = start.elapsed();
    let report = stop(flow, test, sent, bytes)?;
    Ok(TestResult::new(size, sent, bytes, send_time, report))
}

/// Sends STOP every 100 ms, at most 20 times, until the REPORT of `test` comes.
fn stop(flow: &Flow, test: u32, sent_sdus: u64, sent_bytes: u64) -> Result<Report, String> {
    let msg = Msg::Stop {
        test,
        sent_sdus,
        sent_bytes,
    }
    .encode();
    let mut buf = vec![0u8; flow.max_sdu().max(64)];
    for _ in 0..20 {
        flow.write(&msg).map_err(|e| e.to_string())?;
        let deadline = Instant::now() + Duration::from_millis(100);
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match flow.read_timeout(&mut buf, left) {
                Ok(None) => break,
                Ok(Some(n)) => {
                    if let Some(Msg::Report(r)) = Msg::decode(&buf[..n]) {
                        if r.test == test {
                            return Ok(r);
                        }
                    }
                }
                Err(e) if e.is_closed() => return Err(e.to_string()),
                Err(_) => {}
            }
        }
    }
    Err(format!(
        "no REPORT from the server for test {test:08x} after 20 STOPs (2 s)"
    ))
}

fn flush() {
    let _ = std::io::stdout().flush();
}
