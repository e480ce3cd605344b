//! `rina-perf`: goodput and loss, or transactions and latency, of RINA flows.
//!
//! The in-band protocol is described in [`rina_tools::perf`]. `--test perf`
//! (the default) measures one-way throughput; `--test rr` request/response
//! transactions ([`rina_tools::perf::rr`]). With `--sweep`, every size is
//! tested in turn on the same flow; with `--parallel N`, on N flows at once.
//!
//! Exit codes: 0 on success; 1 if a test failed or nothing arrived;
//! 2 on any other error (daemon not running, allocation refused, bad options).

use clap::{Args, Parser, Subcommand, ValueEnum};
use rina::{AppName, Flow};
use rina_tools::opts::{self, CommonArgs, QosArgs};
use rina_tools::perf::{self, FlowReport, Msg, Pacer, PerfReport, Report, TestResult};
use rina_tools::serving;
use rina_tools::table::Table;
use std::io::Write;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const TOOL: &str = "rina-perf";

/// Most flows `--parallel` runs at once (each has a thread).
const MAX_PARALLEL: i64 = 1024;

/// Goodput and loss, or transactions and latency, of RINA flows.
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

/// What a client test measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum TestKind {
    /// One-way throughput and loss: DATA as fast as allowed, then the
    /// receiver's report.
    Perf,
    /// Request/response: transactions per second and their latency.
    Rr,
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
    /// The test: `perf` (throughput and loss) or `rr` (request/response:
    /// transactions per second and latency percentiles).
    #[arg(short = 't', long = "test", value_enum, default_value = "perf")]
    kind: TestKind,
    /// DATA SDU size (perf, at least 17) or request size (rr, at least 21),
    /// at most 1048576, in bytes [default: 1400 for perf, 64 for rr];
    /// --sweep gives several.
    #[arg(long, conflicts_with = "sweep")]
    size: Option<usize>,
    /// rr: size of each response, in bytes (at least 17; cut to the
    /// server's max SDU) [default: the request size].
    #[arg(
        long,
        value_name = "BYTES",
        value_parser = clap::value_parser!(u32).range(perf::RESPONSE_HEADER as i64..)
    )]
    response_size: Option<u32>,
    /// rr: requests kept unanswered at once (1: one transaction at a time)
    /// [default: 1].
    #[arg(long, value_name = "N")]
    outstanding: Option<usize>,
    /// rr: a request unanswered this long is counted lost, in milliseconds
    /// [default: 1000].
    #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..))]
    timeout_ms: Option<u64>,
    /// Run the tests on N flows at once (rinaperf's -p), 1 to 1024, each
    /// with a thread of its own: per-flow results and their total.
    #[arg(
        short = 'p',
        long,
        default_value_t = 1,
        value_name = "N",
        value_parser = clap::value_parser!(u16).range(1..=MAX_PARALLEL)
    )]
    parallel: u16,
    /// Length of each test, in seconds.
    #[arg(
        long,
        default_value_t = 5.0,
        conflicts_with = "count",
        value_parser = opts::parse_positive_seconds
    )]
    duration_s: f64,
    /// Send this many DATA SDUs (perf) or requests (rr) per test instead of
    /// running for a duration (at least 1).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    count: Option<u64>,
    /// perf: pace the sender to this rate, in Mb/s (10^6 bit/s; 1e-6, one
    /// bit/s, to 1e6); a test ends at its --duration-s even when its next
    /// SDU's turn has not come.
    #[arg(long, value_name = "R", value_parser = perf::parse_rate_mbps)]
    rate_mbps: Option<f64>,
    /// Run one test per size, on the same flow (e.g. 64,256,1024,1400).
    #[arg(long, value_delimiter = ',', value_name = "SIZES")]
    sweep: Option<Vec<usize>>,
    /// Print one JSON object (per-flow results and totals).
    #[arg(long, conflicts_with = "csv")]
    json: bool,
    /// Print CSV rows of the totals: for perf
    /// size,sent_sdus,recv_sdus,loss_pct,tx_mbps,rx_mbps,rx_sdus_per_s; for rr
    /// request_size,response_size,outstanding,requests,transactions,lost,tps
    /// and the latency (µs: min, avg, p50, p90, p99, max).
    #[arg(long)]
    csv: bool,
    /// Ask for a direct path (shim-udp, if the server takes one too): the
    /// SDUs go between the two applications' UDP sockets, not through the
    /// daemons.
    #[arg(long)]
    direct: bool,
}

fn main() {
    rina_tools::opts::quiet_on_closed_stdout();
    rina_docgen::handle::<Cli>();
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
    c.set_direct(a.direct);
    serving::register(TOOL, &mut c, &a.name, a.common.dif(), a.daemon_accepts);
    flush();
    let mut workers = Vec::new();
    let mut accepted = 0u64;
    while !matches!(a.max_flows, Some(m) if accepted >= m) {
        if let Some(flow) = serving::next_flow(TOOL, &mut c, a.daemon_accepts) {
            accepted += 1;
            println!(
                "accepted flow {} from {}",
                flow.info().port,
                flow.info().remote
            );
            workers.push(thread::spawn(move || serve_flow(flow)));
            workers.retain(|w| !w.is_finished());
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

/// The sizes to test, checked against the test's header; exits on bad ones.
fn sizes(a: &ClientArgs) -> Vec<usize> {
    let (default, min) = match a.kind {
        TestKind::Perf => (1400, perf::DATA_HEADER),
        TestKind::Rr => (64, perf::REQUEST_HEADER),
    };
    let sizes = a
        .sweep
        .clone()
        .unwrap_or_else(|| vec![a.size.unwrap_or(default)]);
    if sizes.is_empty() {
        opts::die(TOOL, "bad --sweep", &"no size given", 2);
    }
    if let Some(s) = sizes.iter().find(|&&s| s < min) {
        opts::die(
            TOOL,
            "bad size",
            &format!("{s} bytes is less than the {min}-byte header"),
            2,
        );
    }
    if let Some(s) = sizes.iter().find(|&&s| s > perf::MAX_SIZE) {
        opts::die(
            TOOL,
            "bad size",
            &format!("{s} bytes is more than {} (1 MiB)", perf::MAX_SIZE),
            2,
        );
    }
    let rr_only = [
        ("--response-size", a.response_size.is_some()),
        ("--outstanding", a.outstanding.is_some()),
        ("--timeout-ms", a.timeout_ms.is_some()),
    ];
    match a.kind {
        TestKind::Perf => {
            if let Some((o, _)) = rr_only.iter().find(|(_, given)| *given) {
                opts::die(
                    TOOL,
                    &format!("bad {o}"),
                    &"it is for request/response tests (--test rr); a perf test does not use it",
                    2,
                );
            }
        }
        TestKind::Rr if a.rate_mbps.is_some() => opts::die(
            TOOL,
            "bad --rate-mbps",
            &"it paces perf tests; a request/response test (--test rr) is paced by --outstanding",
            2,
        ),
        TestKind::Rr => {}
    }
    let what = match a.kind {
        TestKind::Perf => "DATA SDUs",
        TestKind::Rr => "requests",
    };
    if let Err(e) = a
        .qos
        .check_max_sdu(sizes.iter().copied().max().unwrap_or(0), what)
    {
        opts::die(TOOL, "bad --max-sdu", &e, 2);
    }
    if a.outstanding == Some(0) {
        opts::die(TOOL, "bad --outstanding", &"must be at least 1", 2);
    }
    sizes
}

/// The results of one flow's tests, one entry per size (`None`: it failed).
struct FlowRun {
    port: u32,
    tests: Vec<Option<TestResult>>,
    rr: Vec<Option<perf::rr::RrResult>>,
    error: Option<String>,
}

fn client(a: ClientArgs) -> i32 {
    let sizes = sizes(&a);
    let mut c = a
        .common
        .connect()
        .unwrap_or_else(|e| opts::die(TOOL, "cannot connect", &e, 2));
    c.set_direct(a.direct);
    let mut flows = Vec::new();
    let mut allocation_ms = Vec::new();
    for _ in 0..a.parallel {
        let asked = Instant::now();
        let flow = c
            .allocate(&a.name, &a.dst, a.common.dif(), &a.qos.spec())
            .unwrap_or_else(|e| {
                opts::die(TOOL, &format!("cannot allocate a flow to {}", a.dst), &e, 2)
            });
        allocation_ms.push(asked.elapsed().as_secs_f64() * 1e3);
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
        opts::note_if_not_direct(TOOL, a.direct, &flow);
        flows.push(flow);
    }
    let human = !a.json && !a.csv;
    if human {
        let info = flows[0].info();
        let ports: Vec<String> = flows.iter().map(|f| f.info().port.to_string()).collect();
        println!(
            "PERF {} via {} ({} {}, max SDU {} bytes)",
            a.dst,
            info.dif,
            if flows.len() == 1 { "flow" } else { "flows" },
            ports.join(", "),
            info.max_sdu
        );
        flush();
    }
    let base = test_id_base();
    let runs: Vec<FlowRun> = thread::scope(|s| {
        let workers: Vec<_> = flows
            .iter()
            .map(|flow| {
                let (a, sizes) = (&a, &sizes);
                s.spawn(move || run_flow(flow, a, sizes, base, human))
            })
            .collect();
        workers
            .into_iter()
            .zip(&flows)
            .map(|(w, flow)| {
                w.join().unwrap_or_else(|_| FlowRun {
                    port: flow.info().port,
                    tests: Vec::new(),
                    rr: Vec::new(),
                    error: Some("the flow's thread panicked".into()),
                })
            })
            .collect()
    });
    let mut report = report(&a, &flows[0], &sizes, runs);
    report.allocation_ms = allocation_ms.first().copied();
    for (f, &ms) in report.flows.iter_mut().zip(&allocation_ms) {
        f.allocation_ms = Some(ms);
    }
    print_report(&a, &sizes, &report)
}

/// Runs every size's test on one flow; prints a line per test if `human`.
fn run_flow(flow: &Flow, a: &ClientArgs, sizes: &[usize], base: u32, human: bool) -> FlowRun {
    let port = flow.info().port;
    let mut run = FlowRun {
        port,
        tests: Vec::new(),
        rr: Vec::new(),
        error: None,
    };
    let who = if a.parallel > 1 {
        format!("flow {port}: ")
    } else {
        String::new()
    };
    for (i, &size) in sizes.iter().enumerate() {
        let test = base.wrapping_add(i as u32);
        match a.kind {
            TestKind::Perf => match run_test(flow, a, test, size) {
                Ok(r) => {
                    if human {
                        println!(
                            "{who}size {size}: sent {} SDUs ({:.2} Mb/s), received {} ({:.2} Mb/s, {:.0} SDU/s), loss {:.2}%",
                            r.sent_sdus, r.tx_mbps, r.report.recv_sdus, r.rx_mbps, r.rx_sdus_per_s, r.loss_pct
                        );
                        flush();
                    }
                    run.tests.push(Some(r));
                }
                Err(e) => {
                    eprintln!("{TOOL}: {who}size {size}: {e}");
                    run.tests.push(None);
                    run.error.get_or_insert(e);
                }
            },
            TestKind::Rr => {
                let cfg = perf::rr::RrConfig {
                    test,
                    request_size: size,
                    response_size: a
                        .response_size
                        .unwrap_or(u32::try_from(size).unwrap_or(u32::MAX)),
                    outstanding: a.outstanding.unwrap_or(1),
                    count: a.count,
                    duration: duration(a),
                    timeout: Duration::from_millis(a.timeout_ms.unwrap_or(1000)),
                };
                match perf::rr::run(flow, &cfg) {
                    Ok(r) => {
                        if human {
                            let lat = r.latency_us.map_or("-".into(), |l| {
                                format!("{:.1}/{:.1}/{:.1} µs", l.p50, l.p99, l.max)
                            });
                            println!(
                                "{who}request {size}, response {}, {} outstanding: {} transactions ({:.0}/s), {} lost, latency p50/p99/max {lat}",
                                r.response_size, r.outstanding, r.transactions, r.tps, r.lost
                            );
                            flush();
                        }
                        run.rr.push(Some(r));
                    }
                    Err(e) => {
                        eprintln!("{TOOL}: {who}size {size}: {e}");
                        run.rr.push(None);
                        run.error.get_or_insert(e.to_string());
                    }
                }
            }
        }
    }
    run
}

/// The JSON report: per flow, and the totals per size over the flows.
fn report(a: &ClientArgs, first: &Flow, sizes: &[usize], runs: Vec<FlowRun>) -> PerfReport {
    let mut tests = Vec::new();
    let mut rr = Vec::new();
    for i in 0..sizes.len() {
        let t: Vec<&TestResult> = runs
            .iter()
            .filter_map(|r| r.tests.get(i)?.as_ref())
            .collect();
        tests.extend(TestResult::total(&t));
        let q: Vec<&perf::rr::RrResult> =
            runs.iter().filter_map(|r| r.rr.get(i)?.as_ref()).collect();
        rr.extend(perf::rr::RrResult::total(&q));
    }
    PerfReport {
        dst: a.dst.to_string(),
        dif: first.info().dif.clone(),
        port: first.info().port,
        tests,
        rr,
        allocation_ms: None,
        flows: runs
            .into_iter()
            .map(|r| FlowReport {
                port: r.port,
                tests: r.tests.into_iter().flatten().collect(),
                rr: r.rr.into_iter().flatten().collect(),
                error: r.error,
                allocation_ms: None,
            })
            .collect(),
    }
}

/// Prints the report as asked; returns the exit code (1 if a test failed
/// or nothing arrived).
fn print_report(a: &ClientArgs, sizes: &[usize], report: &PerfReport) -> i32 {
    let failed = report.flows.iter().any(|f| f.error.is_some());
    let empty = match a.kind {
        TestKind::Perf => report.tests.iter().any(|t| t.report.recv_sdus == 0),
        TestKind::Rr => report.rr.iter().any(|t| t.transactions == 0),
    };
    if a.json {
        match serde_json::to_string(report) {
            Ok(s) => println!("{s}"),
            Err(e) => opts::die(TOOL, "cannot encode JSON", &e, 2),
        }
    } else if a.csv {
        match a.kind {
            TestKind::Perf => {
                println!("{}", TestResult::CSV_HEADER);
                for r in &report.tests {
                    println!("{}", r.csv_row());
                }
            }
            TestKind::Rr => {
                println!("{}", perf::rr::RrResult::CSV_HEADER);
                for r in &report.rr {
                    println!("{}", r.csv_row());
                }
            }
        }
    } else {
        if report.flows.len() > 1 {
            println!("total of {} flows:", report.flows.len());
        }
        match a.kind {
            TestKind::Perf => print!("{}", results_table(sizes, &report.tests).render()),
            TestKind::Rr => print!("{}", rr_table(sizes, &report.rr).render()),
        }
    }
    i32::from(failed || empty)
}

/// The human-readable table of request/response results.
fn rr_table(sizes: &[usize], tests: &[perf::rr::RrResult]) -> Table {
    let mut t = Table::new(&[
        "REQ", "RESP", "OUTST", "TRANS", "LOST", "TRANS/s", "MIN_us", "P50_us", "P90_us", "P99_us",
        "MAX_us",
    ])
    .numeric(&[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
    // Results come in the order of the sizes, without the failed ones.
    let mut results = tests.iter().peekable();
    for &size in sizes {
        let Some(r) = results.next_if(|r| r.request_size == size) else {
            t.row(failed_row(size, 11));
            continue;
        };
        let l = |f: fn(&rina_tools::stats::Summary) -> f64| {
            r.latency_us
                .as_ref()
                .map_or("-".into(), |s| format!("{:.1}", f(s)))
        };
        t.row(vec![
            r.request_size.to_string(),
            r.response_size.to_string(),
            r.outstanding.to_string(),
            r.transactions.to_string(),
            r.lost.to_string(),
            format!("{:.0}", r.tps),
            l(|s| s.min),
            l(|s| s.p50),
            l(|s| s.p90),
            l(|s| s.p99),
            l(|s| s.max),
        ]);
    }
    t
}

fn duration(a: &ClientArgs) -> Duration {
    Duration::from_secs_f64(if a.duration_s.is_finite() {
        a.duration_s.clamp(0.0, 1e9)
    } else {
        0.0
    })
}

/// The human-readable table of test results.
fn results_table(sizes: &[usize], tests: &[TestResult]) -> Table {
    let mut t = Table::new(&[
        "SIZE", "SENT", "RECV", "LOSS%", "TX_Mb/s", "TX_SDU/s", "RX_Mb/s", "RX_SDU/s", "DUP",
        "REORD",
    ])
    .numeric(&[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
    // Results come in the order of the sizes, without the failed ones.
    let mut results = tests.iter().peekable();
    for &size in sizes {
        let Some(r) = results.next_if(|r| r.size == size) else {
            t.row(failed_row(size, 10));
            continue;
        };
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

/// The row of a size whose test gave no result on any flow (its error
/// was printed when it failed): the size, then "failed" and dashes, so
/// that it does not read as a test in which nothing arrived.
fn failed_row(size: usize, columns: usize) -> Vec<String> {
    let mut row = vec![size.to_string(), "failed".to_string()];
    row.resize(columns, "-".to_string());
    row
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
    let duration = duration(a);
    let start = Instant::now();
    // With --count, the test lasts as long as its SDUs take.
    let deadline = a.count.is_none().then(|| start + duration);
    let (mut sent, mut bytes) = (0u64, 0u64);
    loop {
        match a.count {
            Some(n) if sent >= n => break,
            None if start.elapsed() >= duration => break,
            _ => {}
        }
        if pacer.as_mut().is_some_and(|p| !p.wait(size, deadline)) {
            break;
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

/// Rounds of 100 ms the client waits for a REPORT once what it wrote no
/// longer drains from its ring or socket. What EFCP still holds then (its
/// queue of 64 SDUs and the window) is invisible from here: with ten flows
/// sharing 10 Mb/s (about 100 SDUs/s each) it took more than 2 s.
const STOP_PATIENCE: u32 = 60;

/// Asks for the REPORT of `test`: a STOP, then another every 100 ms (a STOP
/// may be lost on an unreliable flow) until the REPORT comes.
///
/// The STOP and the REPORT queue behind every DATA SDU still on its way: in
/// the flow's socket or ring, in EFCP's queue and window. On a slow or
/// shared flow that takes longer than any fixed wait (a 4 MiB ring holds
/// over a second of 10 Mb/s), so the client waits as long as what it wrote
/// keeps draining ([`rina::Flow::unsent_bytes`] shrinks), sends STOPs only
/// once the earlier ones have left, and gives up after [`STOP_PATIENCE`]
/// rounds of 100 ms without progress: a flow that no longer drains, or a
/// server that does not answer.
fn stop(flow: &Flow, test: u32, sent_sdus: u64, sent_bytes: u64) -> Result<Report, String> {
    let msg = Msg::Stop {
        test,
        sent_sdus,
        sent_bytes,
    }
    .encode();
    let mut buf = vec![0u8; flow.max_sdu().max(64)];
    let begin = Instant::now();
    let (mut idle, mut stops) = (0u32, 0u32);
    let mut last_backlog = usize::MAX;
    let mut echoed = false;
    while idle < STOP_PATIENCE {
        let backlog = flow.unsent_bytes().unwrap_or(0);
        if backlog > 0 && backlog < last_backlog {
            idle = 0;
        } else {
            idle += 1;
        }
        last_backlog = backlog;
        if backlog == 0 || stops == 0 {
            flow.write(&msg).map_err(|e| e.to_string())?;
            stops += 1;
        }
        if let Some(r) = wait_report(
            flow,
            test,
            &mut buf,
            Duration::from_millis(100),
            &mut echoed,
        )? {
            return Ok(r);
        }
        if echoed {
            return Err(format!(
                "no REPORT from the server for test {test:08x}: it sent this client's own STOP \
                 back, so it echoes what it is sent (a rina-echo server?) instead of answering \
                 as `rina-perf server` does (--dst names the server)"
            ));
        }
    }
    Err(format!(
        "no REPORT from the server for test {test:08x} after {stops} STOPs ({:.1} s, the last {:.1} s without the flow draining)",
        begin.elapsed().as_secs_f64(),
        f64::from(STOP_PATIENCE) / 10.0
    ))
}

/// Reads for at most `wait` until the REPORT of `test` comes; sets
/// `echoed` if the test's own STOP comes back (only clients send STOPs).
fn wait_report(
    flow: &Flow,
    test: u32,
    buf: &mut [u8],
    wait: Duration,
    echoed: &mut bool,
) -> Result<Option<Report>, String> {
    let deadline = Instant::now() + wait;
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        match flow.read_timeout(buf, left) {
            Ok(None) => break,
            Ok(Some(n)) => match Msg::decode(&buf[..n]) {
                Some(Msg::Report(r)) if r.test == test => return Ok(Some(r)),
                Some(Msg::Stop { test: t, .. }) if t == test => *echoed = true,
                _ => {}
            },
            Err(e) if e.is_closed() => return Err(e.to_string()),
            Err(_) => {}
        }
    }
    Ok(None)
}

fn flush() {
    let _ = std::io::stdout().flush();
}
