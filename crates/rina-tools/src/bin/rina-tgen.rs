//! `rina-tgen`: traffic generator and meter for RINA flows.
//!
//! The server registers a name and accepts flows; on each it measures what
//! the client sends (`fwd`), sends traffic back when asked (`rev`), and
//! echoes RTT probes. The client runs one flow from the command line or many
//! from a traffic matrix (`--matrix`), measures `rev` and `rtt`, and gets the
//! server's `fwd` report at the end. Wire format, profiles, metrics and files
//! are described in [`rina_tools::tgen`] and `docs/rina-tgen.md`.
//!
//! Exit codes: 0 on success; 1 if a flow could not be allocated, got no
//! REPORT, or received nothing it should have; 2 on any other error.

use clap::{Args, Parser, Subcommand};
use rina::{AppName, Flow};
use rina_tools::opts::{self, CommonArgs, QosArgs};
use rina_tools::perf::{Clock, SleepClock};
use rina_tools::table::Table;
use rina_tools::tgen::gen::{self, Generator, SourceSpec, PROFILE_NAMES};
use rina_tools::tgen::header::{Header, Kind, HEADER_LEN};
use rina_tools::tgen::matrix::{FlowPlan, Matrix};
use rina_tools::tgen::metrics::{FlowMetrics, FlowReport};
use rina_tools::tgen::output::{FlowEntry, FlowLog, RunReport, SentCount, SCHEMA_VERSION};
use rina_tools::tgen::sender::{self, Step};
use rina_tools::tgen::{realtime_ns, Direction, Hello};
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

const TOOL: &str = "rina-tgen";

/// Traffic generator and meter for RINA flows.
#[derive(Debug, Parser)]
#[command(name = "rina-tgen", version)]
struct Cli {
    #[command(subcommand)]
    mode: Mode,
}

#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
enum Mode {
    /// Register a name, accept flows, measure them and send traffic back.
    Server(ServerArgs),
    /// Run one flow, or the flows of a traffic matrix, against servers.
    Client(ClientArgs),
    /// List the traffic profiles.
    Profiles,
}

#[derive(Debug, Args)]
struct OutArgs {
    /// Write PREFIX.json, PREFIX.csv (and PREFIX.delays.csv with --samples).
    #[arg(long, value_name = "PREFIX")]
    out: Option<PathBuf>,
    /// Keep up to N raw delay samples per flow and direction (0: histogram only).
    #[arg(long, value_name = "N", default_value_t = 0)]
    samples: usize,
    /// Seconds between interval reports on stderr (0: none).
    #[arg(long, value_name = "S", default_value_t = 1.0, value_parser = opts::parse_seconds)]
    interval_s: f64,
    /// Print the final report as one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct ServerArgs {
    #[command(flatten)]
    common: CommonArgs,
    /// Application name to register.
    #[arg(long, default_value = "tgen", value_parser = opts::parse_name)]
    name: AppName,
    /// Accept this many flows (at least 1), then exit once they are all
    /// closed.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    max_flows: Option<u64>,
    /// List at most the last N flows that ended in the report and files
    /// (default: 1000, or --max-flows if more); the report's totals count
    /// every flow.
    #[arg(long, value_name = "N")]
    keep_flows: Option<usize>,
    #[command(flatten)]
    out: OutArgs,
}

/// Flows that ended whose entries a server keeps without `--keep-flows`.
const KEEP_FLOWS: usize = 1000;

#[derive(Debug, Args)]
struct ClientArgs {
    #[command(flatten)]
    common: CommonArgs,
    #[command(flatten)]
    qos: QosArgs,
    /// Name of the tgen server.
    #[arg(long, default_value = "tgen", value_parser = opts::parse_name)]
    dst: AppName,
    /// This client's application name.
    #[arg(long, default_value = "tgen-client", value_parser = opts::parse_name)]
    name: AppName,
    /// Traffic profile (see `rina-tgen profiles`).
    #[arg(long, default_value = "cbr")]
    profile: String,
    /// Rate, bit/s (CBR, Poisson, ON-OFF during ON, max of varying sources,
    /// voice's mean): above 0, at most 1e12.
    #[arg(long, value_name = "BPS", value_parser = gen::parse_rate)]
    rate_bps: Option<f64>,
    /// SDU size in bytes, header included (28 to 1048576).
    #[arg(long, value_name = "BYTES", value_parser = gen::parse_size)]
    size: Option<usize>,
    /// Mean ON (talk) period, s (ON-OFF profiles and voice only; 1e-6 to
    /// 1e9).
    #[arg(long, value_name = "S", value_parser = gen::parse_period)]
    on_s: Option<f64>,
    /// Mean OFF (silence) period, s (ON-OFF profiles and voice only; 1e-6
    /// to 1e9).
    #[arg(long, value_name = "S", value_parser = gen::parse_period)]
    off_s: Option<f64>,
    /// Length of the flow, s.
    #[arg(long, default_value_t = 10.0, value_parser = opts::parse_positive_seconds)]
    duration_s: f64,
    /// forward, reverse or bidirectional.
    #[arg(long, value_enum, default_value = "bidirectional")]
    direction: DirArg,
    /// Seed of the generators: the same seed repeats the same schedules
    /// (with --matrix: unless the file has a seed).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Run the flows of this TOML traffic matrix instead of one flow: the
    /// file says each flow's server, profile, overrides, length, direction
    /// and QoS, so the options for those are refused with it.
    #[arg(
        long,
        value_name = "FILE",
        conflicts_with_all = [
            "dst", "profile", "rate_bps", "size", "on_s", "off_s", "duration_s", "direction",
            "max_delay_ms", "max_loss_ppm", "bandwidth_bps", "in_order", "reliable",
            "max_sdu_gap", "max_sdu", "qos_cube",
        ]
    )]
    matrix: Option<PathBuf>,
    /// Retry an allocation that fails (the destination not yet known, no
    /// route yet) every 200 ms for up to this many seconds of the flow's
    /// time; the flow then runs for what is left of its duration.
    #[arg(long, value_name = "S", default_value_t = 0.0, value_parser = opts::parse_seconds)]
    alloc_retry_s: f64,
    /// How long a flow that ended waits for the server's REPORT (its FIN
    /// is repeated meanwhile): longer than the flow's worst delay (0.1 to
    /// 3600 s; shorter or longer waits are taken as those).
    #[arg(long, value_name = "S", default_value_t = 2.0, value_parser = opts::parse_seconds)]
    report_wait_s: f64,
    /// Also send RTT probes on every flow (delay = RTT / 2, no clock offset).
    #[arg(long)]
    rtt: bool,
    /// Interval between RTT probes, ms (more than 0; taken as 0.1 to
    /// 3600000).
    #[arg(long, default_value_t = 100.0, value_parser = opts::parse_positive)]
    probe_interval_ms: f64,
    #[command(flatten)]
    out: OutArgs,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum DirArg {
    Forward,
    Reverse,
    Bidirectional,
}

impl From<DirArg> for Direction {
    fn from(d: DirArg) -> Direction {
        match d {
            DirArg::Forward => Direction::Forward,
            DirArg::Reverse => Direction::Reverse,
            DirArg::Bidirectional => Direction::Bidirectional,
        }
    }
}

fn main() {
    rina_tools::opts::quiet_on_closed_stdout();
    rina_docgen::handle::<Cli>();
    match Cli::parse().mode {
        Mode::Server(a) => server(a),
        Mode::Client(a) => std::process::exit(client(a)),
        Mode::Profiles => {
            let mut t = Table::new(&["PROFILE", "WHAT"]);
            for (n, d) in PROFILE_NAMES {
                t.row(vec![n.to_string(), d.to_string()]);
            }
            print!("{}", t.render());
        }
    }
}

fn flush() {
    let _ = std::io::stdout().flush();
}

/// Counters shared with the interval reporter.
#[derive(Default)]
struct Live {
    tx_sdus: AtomicU64,
    tx_bytes: AtomicU64,
    rx_sdus: AtomicU64,
    rx_bytes: AtomicU64,
    active: AtomicU64,
}

/// Prints one line per interval on stderr until `stop`.
fn reporter(live: Arc<Live>, interval_s: f64, stop: Arc<AtomicBool>) {
    if !(interval_s.is_finite() && interval_s > 0.0) {
        return;
    }
    thread::spawn(move || {
        let start = Instant::now();
        let every = Duration::from_secs_f64(interval_s);
        let (mut tx0, mut rx0, mut txs0, mut rxs0) = (0, 0, 0, 0);
        let mut next = start + every;
        while !stop.load(Ordering::Relaxed) {
            SleepClock.sleep_until(next);
            if stop.load(Ordering::Relaxed) {
                break;
            }
            let (tx, rx) = (
                live.tx_bytes.load(Ordering::Relaxed),
                live.rx_bytes.load(Ordering::Relaxed),
            );
            let (txs, rxs) = (
                live.tx_sdus.load(Ordering::Relaxed),
                live.rx_sdus.load(Ordering::Relaxed),
            );
            eprintln!(
                "[{:7.1} s] flows {:3}  tx {:9.3} Mb/s {:7} SDUs  rx {:9.3} Mb/s {:7} SDUs",
                start.elapsed().as_secs_f64(),
                live.active.load(Ordering::Relaxed),
                (tx - tx0) as f64 * 8.0 / interval_s / 1e6,
                txs - txs0,
                (rx - rx0) as f64 * 8.0 / interval_s / 1e6,
                rxs - rxs0,
            );
            (tx0, rx0, txs0, rxs0) = (tx, rx, txs, rxs);
            next += every;
        }
    });
}

/// Sends the schedule of `gen` (none: probes only) on `flow` for
/// `duration`, with RTT probes every `probe` if set, until the end or
/// `stop` (looked at every [`sender::SLICE`] at least). Returns (SDUs,
/// bytes) of DATA written, or the error that ended it.
fn send_schedule(
    flow: &Flow,
    flow_id: u32,
    gen: Option<Generator>,
    duration: Duration,
    probe: Option<Duration>,
    live: &Live,
    stop: &AtomicBool,
) -> Result<(u64, u64), rina::Error> {
    let clock = SleepClock;
    let start = clock.now();
    let end = start + duration;
    // At most MAX_SIZE (Profile::validate); a server also refuses a source
    // larger than its flow's maximum SDU.
    let mut buf = vec![0u8; gen.as_ref().map_or(HEADER_LEN, |g| g.profile().max_size())];
    let mut gen = gen.map(Iterator::peekable);
    let (mut sent, mut bytes, mut probes) = (0u64, 0u64, 0u64);
    let mut next_probe = probe.map(|_| start);
    while !stop.load(Ordering::Relaxed) {
        let next_data = gen.as_mut().and_then(|g| g.peek().copied());
        let data_at = next_data.and_then(|p| start.checked_add(Duration::from_nanos(p.at_ns)));
        match sender::next_step(clock.now(), end, data_at, next_probe) {
            Step::Done => break,
            Step::Sleep(t) => clock.sleep_until(t),
            Step::Probe => {
                let h = Header {
                    kind: Kind::Probe,
                    flow: flow_id,
                    seq: probes,
                    send_ns: realtime_ns(),
                };
                flow.write(&h.encode_with(&[]))?;
                probes += 1;
                next_probe = next_probe.zip(probe).and_then(|(t, p)| t.checked_add(p));
            }
            Step::Data => {
                let size = next_data.map_or(HEADER_LEN, |p| p.size);
                if let Some(g) = gen.as_mut() {
                    g.next();
                }
                Header::data(flow_id, sent, realtime_ns()).write(&mut buf);
                match flow.write(&buf[..size]) {
                    Ok(()) => {}
                    Err(e) if opts::is_transient(&e) => continue,
                    Err(e) => return Err(e),
                }
                sent += 1;
                bytes += size as u64;
                live.tx_sdus.fetch_add(1, Ordering::Relaxed);
                live.tx_bytes.fetch_add(size as u64, Ordering::Relaxed);
            }
        }
    }
    Ok((sent, bytes))
}

fn fin(flow_id: u32, sent: u64, bytes: u64) -> Vec<u8> {
    Header {
        kind: Kind::Fin,
        flow: flow_id,
        seq: sent,
        send_ns: bytes,
    }
    .encode_with(&[])
}

// ---------------------------------------------------------------- server

struct ServerFlow {
    peer: String,
    dif: String,
    qos: rina::QosSpec,
    hello: Mutex<Option<Hello>>,
    /// The measurement while the flow is open; `None` once it ended and
    /// its entry is in the [`ServerFlows`] log.
    fwd: Mutex<Option<FlowMetrics>>,
    sent: Mutex<Option<(u64, u64)>>,
    error: Mutex<Option<String>>,
}

impl ServerFlow {
    /// The flow's entry in the report, as measured so far.
    fn entry(&self, with_samples: bool) -> FlowEntry {
        let hello = self.hello.lock().unwrap().clone();
        let fwd = self.fwd.lock().unwrap();
        FlowEntry {
            flow: hello
                .as_ref()
                .map(|h| h.flow)
                .or(fwd.as_ref().map(|m| m.flow()))
                .unwrap_or(0),
            peer: self.peer.clone(),
            dif: self.dif.clone(),
            profile: hello
                .as_ref()
                .map_or_else(String::new, |h| h.source.profile.clone()),
            direction: hello.as_ref().map_or(Direction::Forward, |h| h.direction),
            seed: hello.as_ref().map_or(0, |h| h.seed),
            qos: self.qos,
            error: self.error.lock().unwrap().clone(),
            reports: fwd
                .iter()
                .map(|m| m.report("fwd", true, with_samples))
                .collect(),
            sent: None,
            allocation_ms: None,
        }
    }

    /// The entry of a flow that ended, built once; its measurement (the
    /// histogram, the duplicate window, the samples) is dropped.
    fn finish(&self, with_samples: bool) -> FlowEntry {
        let e = self.entry(with_samples);
        *self.fwd.lock().unwrap() = None;
        e
    }
}

/// A server's flows: those still open, and the log of those that ended.
struct ServerFlows {
    open: Vec<Arc<ServerFlow>>,
    done: FlowLog,
}

impl ServerFlows {
    fn new(keep: usize) -> ServerFlows {
        ServerFlows {
            open: Vec::new(),
            done: FlowLog::new(keep),
        }
    }

    /// Moves `sf`, which ended, from the open flows to the log.
    fn end(&mut self, sf: &Arc<ServerFlow>, with_samples: bool) {
        self.open.retain(|o| !Arc::ptr_eq(o, sf));
        self.done.push(sf.finish(with_samples));
    }

    /// The report: the flows kept in the log, then the open ones, and the
    /// totals of all that ended.
    fn report(&self, started_ns: u64, with_samples: bool) -> RunReport {
        let mut flows: Vec<FlowEntry> = self.done.entries().cloned().collect();
        flows.extend(self.open.iter().map(|sf| sf.entry(with_samples)));
        RunReport {
            tool: TOOL.into(),
            schema: SCHEMA_VERSION,
            role: "server".into(),
            started_ns,
            ended_ns: realtime_ns(),
            flows,
            totals: Some(self.done.totals().clone()),
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
    let started_ns = realtime_ns();
    let live = Arc::new(Live::default());
    let stop = Arc::new(AtomicBool::new(false));
    reporter(live.clone(), a.out.interval_s, stop.clone());
    let keep = a.keep_flows.unwrap_or_else(|| {
        let max = a
            .max_flows
            .map_or(0, |m| usize::try_from(m).unwrap_or(usize::MAX));
        KEEP_FLOWS.max(max)
    });
    let flows = Arc::new(Mutex::new(ServerFlows::new(keep)));
    let write_lock = Arc::new(Mutex::new(()));
    let samples = a.out.samples;
    let mut workers: Vec<thread::JoinHandle<()>> = Vec::new();
    let mut accepted = 0u64;
    while !matches!(a.max_flows, Some(m) if accepted >= m) {
        let req = c
            .next_request()
            .unwrap_or_else(|e| opts::die(TOOL, "lost the daemon", &e, 2));
        // A finished thread's handle would keep its stack until joined.
        workers.retain(|w| !w.is_finished());
        match c.accept(&req) {
            Ok(flow) => {
                accepted += 1;
                let sf = Arc::new(ServerFlow {
                    peer: req.remote.to_string(),
                    dif: flow.info().dif.clone(),
                    qos: flow.info().qos,
                    hello: Mutex::new(None),
                    fwd: Mutex::new(None),
                    sent: Mutex::new(None),
                    error: Mutex::new(None),
                });
                flows.lock().unwrap().open.push(sf.clone());
                let (live, flows, out, wl) = (
                    live.clone(),
                    flows.clone(),
                    a.out.out.clone(),
                    write_lock.clone(),
                );
                workers.push(thread::spawn(move || {
                    serve_flow(Arc::new(flow), &sf, &live, samples);
                    flows.lock().unwrap().end(&sf, samples > 0);
                    if let Some(prefix) = out {
                        let _g = wl.lock().unwrap();
                        let r = flows.lock().unwrap().report(started_ns, samples > 0);
                        if let Err(e) = r.write_files(&prefix) {
                            eprintln!("{TOOL}: cannot write {}: {e}", prefix.display());
                        }
                    }
                }));
            }
            Err(e) if e.is_closed() => opts::die(TOOL, "lost the daemon", &e, 2),
            Err(e) => eprintln!("{TOOL}: cannot accept flow from {}: {e}", req.remote),
        }
    }
    for w in workers {
        let _ = w.join();
    }
    stop.store(true, Ordering::Relaxed);
    let r = flows.lock().unwrap().report(started_ns, samples > 0);
    print_final(&r, a.out.json);
}

fn serve_flow(flow: Arc<Flow>, sf: &Arc<ServerFlow>, live: &Arc<Live>, samples: usize) {
    live.active.fetch_add(1, Ordering::Relaxed);
    let mut buf = vec![0u8; flow.max_sdu().max(HEADER_LEN)];
    let stop = Arc::new(AtomicBool::new(false));
    let mut rev: Option<thread::JoinHandle<()>> = None;
    loop {
        let n = match flow.read(&mut buf) {
            Ok(n) => n,
            Err(e) if opts::is_transient(&e) => continue,
            Err(e) => {
                if !e.is_closed() {
                    *sf.error.lock().unwrap() = Some(e.to_string());
                }
                break;
            }
        };
        let now = realtime_ns();
        let Some(h) = Header::decode(&buf[..n]) else {
            continue;
        };
        match h.kind {
            Kind::Data => {
                let mut fwd = sf.fwd.lock().unwrap();
                let m = fwd.get_or_insert_with(|| FlowMetrics::new(h.flow, samples));
                if m.on_sdu(now, &h, n) {
                    live.rx_sdus.fetch_add(1, Ordering::Relaxed);
                    live.rx_bytes.fetch_add(n as u64, Ordering::Relaxed);
                }
            }
            Kind::Probe => {
                let mut reply = buf[..n].to_vec();
                reply[4] = Kind::ProbeReply as u8;
                let _ = flow.write(&reply);
            }
            Kind::Hello => {
                let Ok(hello) = serde_json::from_slice::<Hello>(&buf[HEADER_LEN..n]) else {
                    continue;
                };
                let mut slot = sf.hello.lock().unwrap();
                if slot.is_some() {
                    continue;
                }
                *slot = Some(hello.clone());
                sf.fwd
                    .lock()
                    .unwrap()
                    .get_or_insert_with(|| FlowMetrics::new(hello.flow, samples));
                if hello.direction.server_sends() {
                    rev = start_reverse(&flow, sf, hello, live, &stop);
                }
            }
            Kind::Fin => {
                let body = {
                    let mut fwd = sf.fwd.lock().unwrap();
                    let m = fwd.get_or_insert_with(|| FlowMetrics::new(h.flow, samples));
                    m.on_fin(h.seq, h.send_ns);
                    let with_hist = m.report("fwd", true, false);
                    let plain = m.report("fwd", false, false);
                    let hdr = Header {
                        kind: Kind::Report,
                        flow: h.flow,
                        seq: 0,
                        send_ns: 0,
                    };
                    let a = hdr.encode_with(&serde_json::to_vec(&with_hist).unwrap_or_default());
                    if a.len() <= flow.max_sdu() {
                        a
                    } else {
                        hdr.encode_with(&serde_json::to_vec(&plain).unwrap_or_default())
                    }
                };
                let _ = flow.write(&body);
            }
            Kind::ProbeReply | Kind::Report => {}
        }
    }
    stop.store(true, Ordering::Relaxed);
    if let Some(r) = rev {
        let _ = r.join();
    }
    live.active.fetch_sub(1, Ordering::Relaxed);
}

/// Starts the thread that sends `hello`'s reverse traffic on `flow` until
/// its end or `stop`; `None`, said on stderr, kept as the flow's error and
/// told the peer with a FIN of nothing sent, if the source is refused (a
/// bad one, or SDUs larger than the flow carries).
fn start_reverse(
    flow: &Arc<Flow>,
    sf: &Arc<ServerFlow>,
    hello: Hello,
    live: &Arc<Live>,
    stop: &Arc<AtomicBool>,
) -> Option<thread::JoinHandle<()>> {
    let refused = match hello.source.profile() {
        Err(e) => Err(format!("its HELLO's source is refused: {e}")),
        Ok(p) if p.max_size() > flow.max_sdu() => Err(format!(
            "its HELLO asks for SDUs of {} bytes, more than the flow's maximum SDU of {} bytes",
            p.max_size(),
            flow.max_sdu()
        )),
        Ok(p) => Ok(p),
    };
    let profile = match refused {
        Ok(p) => p,
        Err(e) => {
            let e = format!("{e}: no reverse traffic");
            eprintln!("{TOOL}: flow {} from {}: {e}", hello.flow, sf.peer);
            *sf.error.lock().unwrap() = Some(e);
            *sf.sent.lock().unwrap() = Some((0, 0));
            let _ = flow.write(&fin(hello.flow, 0, 0));
            return None;
        }
    };
    let (flow, live, stop, sf) = (flow.clone(), live.clone(), stop.clone(), sf.clone());
    Some(thread::spawn(move || {
        let secs = hello.duration_s.clamp(0.0, opts::MAX_SECONDS);
        let d = Duration::from_secs_f64(if secs.is_nan() { 0.0 } else { secs });
        let gen = Generator::new(profile, hello.seed);
        match send_schedule(&flow, hello.flow, Some(gen), d, None, &live, &stop) {
            Ok((s, b)) => {
                *sf.sent.lock().unwrap() = Some((s, b));
                for _ in 0..3 {
                    if flow.write(&fin(hello.flow, s, b)).is_err() {
                        break;
                    }
                    thread::sleep(Duration::from_millis(20));
                }
            }
            Err(e) => *sf.error.lock().unwrap() = Some(e.to_string()),
        }
    }))
}

// ---------------------------------------------------------------- client

/// Time between two tries of a failed allocation (`--alloc-retry-s`).
const RETRY: Duration = Duration::from_millis(200);

struct ClientFlow {
    rev: Mutex<FlowMetrics>,
    rtt: Mutex<FlowMetrics>,
    fwd: Mutex<Option<FlowReport>>,
    rev_fin: AtomicBool,
    /// The client's own HELLO came back: the peer echoes what it is sent
    /// (a `rina-echo server`), it is no tgen server.
    echoed: AtomicBool,
    /// The flow failed under the receiver (closed): the sender stops too,
    /// rather than sleep until its next SDU.
    closed: AtomicBool,
}

/// Runs the client: starts every planned flow in time, waits for them and
/// reports; returns the exit code.
fn client(a: ClientArgs) -> i32 {
    let plans = client_plans(&a);
    let probe = a
        .rtt
        .then(|| Duration::from_secs_f64((a.probe_interval_ms / 1e3).clamp(1e-4, 3600.0)));
    let mut c = a
        .common
        .connect()
        .unwrap_or_else(|e| opts::die(TOOL, "cannot connect", &e, 2));
    let started_ns = realtime_ns();
    let start = Instant::now();
    let live = Arc::new(Live::default());
    let stop = Arc::new(AtomicBool::new(false));
    reporter(live.clone(), a.out.interval_s, stop.clone());
    let mut order: Vec<&FlowPlan> = plans.iter().collect();
    order.sort_by(|x, y| x.start_s.total_cmp(&y.start_s));
    let mut run = ClientRun {
        a: &a,
        c: &mut c,
        start,
        live,
        probe,
        report_wait: Duration::from_secs_f64(a.report_wait_s.clamp(0.1, 3600.0)),
        human: !a.out.json,
        workers: Vec::new(),
        failed: Vec::new(),
    };
    for p in order {
        run.start_flow(p);
    }
    let mut entries: Vec<FlowEntry> = run
        .workers
        .into_iter()
        .filter_map(|w| w.join().ok())
        .collect();
    stop.store(true, Ordering::Relaxed);
    entries.extend(run.failed);
    entries.sort_by_key(|e| e.flow);
    let code = client_exit_code(&entries);
    let r = RunReport {
        tool: TOOL.into(),
        schema: SCHEMA_VERSION,
        role: "client".into(),
        started_ns,
        ended_ns: realtime_ns(),
        flows: entries,
        totals: None,
    };
    if let Some(prefix) = &a.out.out {
        if let Err(e) = r.write_files(prefix) {
            opts::die(TOOL, &format!("cannot write {}", prefix.display()), &e, 2);
        }
    }
    print_final(&r, a.out.json);
    code
}

/// The flows to run: those of `--matrix`, or the one of the command line.
fn client_plans(a: &ClientArgs) -> Vec<FlowPlan> {
    let plans = match &a.matrix {
        Some(path) => {
            let text = std::fs::read_to_string(path).unwrap_or_else(|e| {
                opts::die(TOOL, &format!("cannot read {}", path.display()), &e, 2)
            });
            Matrix::parse(&text)
                .and_then(|m| m.plans(a.seed, a.common.dif()))
                .unwrap_or_else(|e| {
                    opts::die(TOOL, &format!("bad matrix {}", path.display()), &e, 2)
                })
        }
        None => {
            let source = SourceSpec {
                profile: a.profile.clone(),
                rate_bps: a.rate_bps,
                size: a.size,
                on_s: a.on_s,
                off_s: a.off_s,
            };
            match source.profile_keyed(["--on-s", "--off-s"]) {
                Err(e) => opts::die(TOOL, "bad profile", &e, 2),
                Ok(p) => {
                    if let Err(e) = a.qos.check_max_sdu(p.max_size(), "SDUs") {
                        opts::die(TOOL, "bad --max-sdu", &e, 2);
                    }
                }
            }
            vec![FlowPlan {
                flow: 1,
                peer: a.dst.to_string(),
                dif: a.common.dif.clone(),
                source,
                qos: a.qos.clone(),
                start_s: 0.0,
                duration_s: a.duration_s,
                direction: a.direction.into(),
                seed: a.seed,
            }]
        }
    };
    if plans.is_empty() {
        opts::die(TOOL, "bad matrix", &"no flows", 2);
    }
    plans
}

/// 1 if a flow failed, got no REPORT or received nothing it should have; else 0.
fn client_exit_code(entries: &[FlowEntry]) -> i32 {
    let mut code = 0;
    for e in entries {
        let has = |d: &str| e.reports.iter().any(|r| r.direction == d);
        let got = |d: &str| {
            e.reports
                .iter()
                .any(|r| r.direction == d && r.recv_sdus > 0)
        };
        if e.error.is_some()
            || (e.direction.client_sends() && !got("fwd"))
            || (e.direction.server_sends() && !has("rev"))
        {
            code = 1;
        }
    }
    code
}

/// What the client shares between the flows it starts.
struct ClientRun<'a> {
    a: &'a ClientArgs,
    c: &'a mut rina::Client,
    /// When the run started: the flows' `start_s` count from here.
    start: Instant,
    live: Arc<Live>,
    probe: Option<Duration>,
    report_wait: Duration,
    /// Whether to say what each flow is (not with `--json`).
    human: bool,
    /// The running flows.
    workers: Vec<thread::JoinHandle<FlowEntry>>,
    /// Flows that could not start.
    failed: Vec<FlowEntry>,
}

impl ClientRun<'_> {
    /// Waits for `p`'s start time, allocates its flow and runs it on a
    /// thread of its own (or records why it could not start).
    fn start_flow(&mut self, p: &FlowPlan) {
        SleepClock.sleep_until(self.start + Duration::from_secs_f64(p.start_s));
        let dst: AppName = match p.peer.parse() {
            Ok(n) => n,
            Err(e) => opts::die(TOOL, &format!("bad peer name {:?}", p.peer), &e, 2),
        };
        let begin = self.start + Duration::from_secs_f64(p.start_s);
        let allocated = self.allocate(p, &dst, begin);
        // What is left of the flow's time after the retries.
        let late = Instant::now()
            .saturating_duration_since(begin)
            .as_secs_f64();
        let mut p = p.clone();
        if late > 0.5 {
            p.duration_s = (p.duration_s - late).max(0.05);
        }
        let p = &p;
        let (flow, allocation_ms) = match allocated {
            Ok(f) => f,
            Err(e) if e.is_closed() => opts::die(TOOL, "lost the daemon", &e, 2),
            Err(e) => {
                let e = format!("cannot allocate a flow to {dst}: {e}");
                eprintln!("{TOOL}: flow {}: {e}", p.flow);
                let dif = p.dif.clone().unwrap_or_default();
                self.failed.push(failed_entry(p, e, dif));
                return;
            }
        };
        let max = p
            .source
            .profile()
            .map(|x| x.max_size())
            .unwrap_or(HEADER_LEN);
        if max > flow.max_sdu() {
            let e = format!(
                "SDUs of {max} bytes exceed the flow's maximum SDU of {} bytes",
                flow.max_sdu()
            );
            eprintln!("{TOOL}: flow {}: {e}", p.flow);
            self.failed
                .push(failed_entry(p, e, flow.info().dif.clone()));
            return;
        }
        if self.human {
            println!(
                "flow {}: {} to {} via {} (port {}), {} s, {}",
                p.flow,
                p.source.profile,
                dst,
                flow.info().dif,
                flow.info().port,
                p.duration_s,
                p.direction
            );
            flush();
        }
        let (p, live, samples) = (p.clone(), self.live.clone(), self.a.out.samples);
        let (probe, report_wait) = (self.probe, self.report_wait);
        self.workers.push(thread::spawn(move || {
            let mut entry = run_client_flow(flow, &p, probe, report_wait, &live, samples);
            entry.allocation_ms = Some(allocation_ms);
            entry
        }));
    }

    /// Allocates `p`'s flow to `dst`, retrying a failure every [`RETRY`]
    /// for `--alloc-retry-s` (at most the flow's duration) from `begin`;
    /// the flow and how long the request that got it took, in ms.
    fn allocate(
        &mut self,
        p: &FlowPlan,
        dst: &AppName,
        begin: Instant,
    ) -> rina::Result<(Flow, f64)> {
        let retry_until =
            begin + Duration::from_secs_f64(self.a.alloc_retry_s.clamp(0.0, p.duration_s));
        loop {
            let asked = Instant::now();
            match self
                .c
                .allocate(&self.a.name, dst, p.dif.as_deref(), &p.qos.spec())
            {
                Ok(f) => break Ok((f, asked.elapsed().as_secs_f64() * 1e3)),
                Err(e) if !e.is_closed() && Instant::now() + RETRY < retry_until => {
                    thread::sleep(RETRY);
                }
                Err(e) => break Err(e),
            }
        }
    }
}

/// The report of a flow of plan `p` that could not start, and why.
fn failed_entry(p: &FlowPlan, error: String, dif: String) -> FlowEntry {
    FlowEntry {
        flow: p.flow,
        peer: p.peer.clone(),
        dif,
        profile: p.source.profile.clone(),
        direction: p.direction,
        seed: p.seed,
        qos: p.qos.spec(),
        error: Some(error),
        reports: Vec::new(),
        sent: None,
        allocation_ms: None,
    }
}

fn run_client_flow(
    flow: Flow,
    p: &FlowPlan,
    probe: Option<Duration>,
    report_wait: Duration,
    live: &Arc<Live>,
    samples: usize,
) -> FlowEntry {
    live.active.fetch_add(1, Ordering::Relaxed);
    let flow = Arc::new(flow);
    let cf = Arc::new(ClientFlow {
        rev: Mutex::new(FlowMetrics::new(p.flow, samples)),
        rtt: Mutex::new(FlowMetrics::new(p.flow, samples)),
        fwd: Mutex::new(None),
        rev_fin: AtomicBool::new(false),
        echoed: AtomicBool::new(false),
        closed: AtomicBool::new(false),
    });
    let stop_rx = Arc::new(AtomicBool::new(false));
    let rx = {
        let (flow, cf, stop, live) = (flow.clone(), cf.clone(), stop_rx.clone(), live.clone());
        thread::spawn(move || client_receiver(&flow, &cf, &stop, &live))
    };
    let hello = Hello {
        flow: p.flow,
        source: p.source.clone(),
        seed: !p.seed,
        duration_s: p.duration_s,
        direction: p.direction,
    };
    let hello = Header {
        kind: Kind::Hello,
        flow: p.flow,
        seq: 0,
        send_ns: realtime_ns(),
    }
    .encode_with(&serde_json::to_vec(&hello).unwrap_or_default());
    let mut error = None;
    for _ in 0..3 {
        if let Err(e) = flow.write(&hello) {
            error = Some(e.to_string());
        }
    }
    let duration = Duration::from_secs_f64(p.duration_s.clamp(0.0, 1e9));
    // The plan's source was checked (client_plans, start_flow).
    let gen = p
        .direction
        .client_sends()
        .then(|| p.source.profile().ok())
        .flatten()
        .map(|prof| Generator::new(prof, p.seed));
    let (sent, bytes) = match send_schedule(&flow, p.flow, gen, duration, probe, live, &cf.closed) {
        Ok(x) => x,
        Err(e) => {
            error = Some(e.to_string());
            (0, 0)
        }
    };
    if cf.closed.load(Ordering::Relaxed) {
        error.get_or_insert_with(|| "the flow failed or closed before its end".into());
    }
    // FIN until the REPORT (and the reverse FIN) came, for at most
    // `report_wait` (twenty FINs, at least 100 ms apart), looking every 100 ms.
    let msg = fin(p.flow, sent, bytes);
    let tick = Duration::from_millis(100);
    let every = (report_wait.as_millis() / 20 / tick.as_millis()).max(1) as u32;
    let ticks = (report_wait.as_millis() / tick.as_millis()).max(1) as u32;
    for i in 0..ticks {
        if i % every == 0 && flow.write(&msg).is_err() {
            break;
        }
        thread::sleep(tick);
        let rev_done = !p.direction.server_sends() || cf.rev_fin.load(Ordering::Relaxed);
        if cf.fwd.lock().unwrap().is_some() && rev_done {
            break;
        }
    }
    stop_rx.store(true, Ordering::Relaxed);
    let _ = rx.join();
    live.active.fetch_sub(1, Ordering::Relaxed);
    let with_samples = samples > 0;
    let mut reports = Vec::new();
    let echoed = cf.echoed.load(Ordering::Relaxed);
    if echoed {
        // What came back is this client's own traffic, not a reverse flow.
        error = Some(format!(
            "no REPORT from the server: {} sent this client's own HELLO back, so it echoes \
             what it is sent (a rina-echo server?) instead of answering as `rina-tgen server` \
             does (--dst names the server)",
            p.peer
        ));
    }
    if p.direction.client_sends() {
        match cf.fwd.lock().unwrap().clone() {
            Some(mut r) => {
                r.direction = "fwd".into();
                reports.push(r);
            }
            None => {
                error.get_or_insert_with(|| "no REPORT from the server".into());
            }
        }
    }
    if p.direction.server_sends() && !echoed {
        reports.push(cf.rev.lock().unwrap().report("rev", true, with_samples));
    }
    if probe.is_some() {
        reports.push(cf.rtt.lock().unwrap().report("rtt", true, with_samples));
    }
    FlowEntry {
        flow: p.flow,
        peer: p.peer.clone(),
        dif: flow.info().dif.clone(),
        profile: p.source.profile.clone(),
        direction: p.direction,
        seed: p.seed,
        qos: p.qos.spec(),
        error,
        reports,
        sent: p
            .direction
            .client_sends()
            .then_some(SentCount { sdus: sent, bytes }),
        allocation_ms: None,
    }
}

fn client_receiver(flow: &Flow, cf: &ClientFlow, stop: &AtomicBool, live: &Live) {
    let mut buf = vec![0u8; flow.max_sdu().max(HEADER_LEN)];
    while !stop.load(Ordering::Relaxed) {
        let n = match flow.read_timeout(&mut buf, Duration::from_millis(50)) {
            Ok(Some(n)) => n,
            Ok(None) => continue,
            Err(e) if opts::is_transient(&e) => continue,
            Err(_) => {
                cf.closed.store(true, Ordering::Relaxed);
                break;
            }
        };
        let now = realtime_ns();
        let Some(h) = Header::decode(&buf[..n]) else {
            continue;
        };
        match h.kind {
            Kind::Data => {
                if cf.rev.lock().unwrap().on_sdu(now, &h, n) {
                    live.rx_sdus.fetch_add(1, Ordering::Relaxed);
                    live.rx_bytes.fetch_add(n as u64, Ordering::Relaxed);
                }
            }
            Kind::ProbeReply => {
                // One-way delay = RTT / 2: "received" half an RTT after sending.
                let half = now.saturating_sub(h.send_ns) / 2;
                cf.rtt.lock().unwrap().on_sdu(h.send_ns + half, &h, n);
            }
            Kind::Fin => {
                cf.rev.lock().unwrap().on_fin(h.seq, h.send_ns);
                cf.rev_fin.store(true, Ordering::Relaxed);
            }
            Kind::Report => {
                if let Ok(r) = serde_json::from_slice::<FlowReport>(&buf[HEADER_LEN..n]) {
                    *cf.fwd.lock().unwrap() = Some(r);
                }
            }
            // Only clients send HELLOs: this one is ours, sent back.
            Kind::Hello => cf.echoed.store(true, Ordering::Relaxed),
            Kind::Probe => {}
        }
    }
}

// ---------------------------------------------------------------- output

fn print_final(r: &RunReport, json: bool) {
    if json {
        match serde_json::to_string(r) {
            Ok(s) => println!("{s}"),
            Err(e) => opts::die(TOOL, "cannot encode JSON", &e, 2),
        }
        return;
    }
    let mut t = Table::new(&[
        "FLOW", "DIR", "PROFILE", "SENT", "RECV", "LOSS%", "DUP", "REORD", "Mb/s", "DMIN_ms",
        "DAVG_ms", "DP99_ms", "DMAX_ms", "JIT_ms",
    ])
    .numeric(&[0, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]);
    let ms = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{:.3}", v / 1e3));
    for f in &r.flows {
        for rep in &f.reports {
            let d = rep.delay;
            t.row(vec![
                f.flow.to_string(),
                rep.direction.clone(),
                f.profile.clone(),
                rep.sent_sdus.to_string(),
                rep.recv_sdus.to_string(),
                format!("{:.2}", rep.loss_pct),
                rep.duplicates.to_string(),
                rep.reordered.to_string(),
                format!("{:.3}", rep.goodput_bps / 1e6),
                ms(d.map(|d| d.min_us)),
                ms(d.map(|d| d.avg_us)),
                ms(d.map(|d| d.p99_us)),
                ms(d.map(|d| d.max_us)),
                ms(d.map(|d| d.jitter_us)),
            ]);
        }
        // A flow that never ran (its allocation failed) was said at once.
        let ran = !f.reports.is_empty() || f.sent.is_some();
        if let Some(e) = f.error.as_ref().filter(|_| ran) {
            eprintln!("{TOOL}: flow {}: {e}", f.flow);
        }
    }
    if !t.is_empty() {
        print!("{}", t.render());
    }
    if let Some(t) = r.totals.as_ref().filter(|t| t.flows_dropped > 0) {
        println!(
            "the last {} of {} flows that ended are listed (--keep-flows); all {}: \
             sent {} SDUs, received {} ({} bytes), lost {}, {} duplicates, {} reordered",
            t.flows - t.flows_dropped,
            t.flows,
            t.flows,
            t.sent_sdus,
            t.recv_sdus,
            t.recv_bytes,
            t.lost_sdus,
            t.duplicates,
            t.reordered
        );
    }
    flush();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server_flow() -> Arc<ServerFlow> {
        Arc::new(ServerFlow {
            peer: "evil".into(),
            dif: "udp".into(),
            qos: rina::QosSpec::default(),
            hello: Mutex::new(None),
            fwd: Mutex::new(None),
            sent: Mutex::new(None),
            error: Mutex::new(None),
        })
    }

    /// What the audit's peer did: one SDU numbered 2^26 - 1 per flow, then
    /// close. Before, the server kept each flow's whole measurement (8 MiB
    /// of duplicate bitmap with this number, a 160 KB histogram, samples)
    /// for ever; now it keeps the entry of the last few.
    #[test]
    fn an_ended_flow_leaves_only_its_entry_and_few_of_those() {
        let mut flows = ServerFlows::new(2);
        for i in 0..5u32 {
            let sf = server_flow();
            let mut m = FlowMetrics::new(i, 100);
            m.on_sdu(10, &Header::data(i, (1 << 26) - 1, 0), HEADER_LEN);
            *sf.fwd.lock().unwrap() = Some(m);
            flows.open.push(sf.clone());
            assert_eq!(flows.report(0, true).flows.len(), (i as usize).min(2) + 1);
            flows.end(&sf, true);
            assert!(sf.fwd.lock().unwrap().is_none());
        }
        assert!(flows.open.is_empty());
        let r = flows.report(0, true);
        let kept: Vec<u32> = r.flows.iter().map(|f| f.flow).collect();
        assert_eq!(kept, vec![3, 4]);
        for f in &r.flows {
            let json = serde_json::to_vec(f).unwrap();
            assert!(json.len() < 2048, "{}", String::from_utf8_lossy(&json));
            assert_eq!(f.reports[0].sent_sdus, 1 << 26);
        }
        let t = r.totals.unwrap();
        assert_eq!((t.flows, t.flows_dropped, t.recv_sdus), (5, 3, 5));
        assert_eq!(t.lost_sdus, 5 * ((1 << 26) - 1));
    }
}
